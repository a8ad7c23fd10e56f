"""What a served flow run reads from its own deployment: the config that `rlhf serve` stored
as the deployment's parameters (here, not in flows/serve.py, which imports the flows it serves)."""

from tasks.config.pipeline_config import PipelineConfig, _merge
from tasks.platform.prefect.logins import login_out_of_uri
from tasks.platform.prefect.prefect_api import deployment_parameters

# A served flow's ``config`` default: a run given none (the UI's Quick run, a schedule) runs
# the served config; a required ``config`` would make Quick run open the whole form instead
SERVED = PipelineConfig()


def served_config(config: PipelineConfig) -> PipelineConfig:
    """A deployment run of a flow taking one ``config``: the fields it was given over the
    served config (outside a deployment run: ``config`` as given)."""
    served = deployment_parameters().get("config")
    if served:
        config = PipelineConfig.model_validate(
            _merge(served, config.model_dump(mode="json", exclude_unset=True)))
    return login_out_of_uri(config)  # a login typed into the form: out of the records
