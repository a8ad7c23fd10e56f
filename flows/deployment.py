"""What a flow run reads from its own deployment: the config that `rlhf serve` stored as the
deployment's parameters. The retrain and collect flows read it here, as does the pipeline
deployment's flow in flows/serve.py; serve.py builds the retrain and collect deployments from
their flows, so it imports them, and they do not import serve.py back."""

from typing import Any

from flows.config import _merge
from tasks.config import PipelineConfig


def deployment_parameters() -> dict[str, Any]:
    """The served config stored on this run's deployment ({} outside a deployment run)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import deployment

    if deployment.id is None:
        return {}
    with get_client(sync_client=True) as client:
        return dict(client.read_deployment(deployment.id).parameters or {})


def served_config(config: PipelineConfig) -> PipelineConfig:
    """A deployment run of a flow taking one ``config``: the fields it was given over the
    served config (outside a deployment run: ``config`` as given)."""
    served = deployment_parameters().get("config")
    if not served:
        return config
    return PipelineConfig.model_validate(
        _merge(served, config.model_dump(mode="json", exclude_unset=True)))
