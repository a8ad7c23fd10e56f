"""`rlhf serve` against a real Prefect server, driven only through the Prefect API (what the
UI calls): the pipeline deployment with no parameters and with a one-field override, and
the parameter schema the server stores."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.flows.prefect_procs import (
    ROOT,
    prefect_server,
    rlhf_serve,
    wait_deployment,
    wait_run,
)

SECTIONS = {"model", "data", "sft", "reward", "ppo", "eval", "tracking"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from prefect.client.orchestration import SyncPrefectClient

    tmp = tmp_path_factory.mktemp("serve")
    uri = f"sqlite:///{tmp}/mlflow.db"
    args = ["--config", str(ROOT / "configs" / "test.yaml"), "--name", "test",
            "--set", f"tracking.tracking_uri={uri}", "--set", f"tracking.workdir={tmp}/runs",
            "--set", "tracking.system_metrics=false"]
    with prefect_server(tmp / "server") as (api, env):
        with rlhf_serve(env, tmp, args) as (proc, log), SyncPrefectClient(api) as client:
            deployment = wait_deployment(client, "rlhf_pipeline/test", proc, log)
            yield client, deployment, MlflowClient(uri), log


def _run(client, deployment, parameters=None):
    run = client.create_flow_run_from_deployment(deployment.id, parameters=parameters or {})
    return wait_run(client, run.id)


def _parent_params(mlflow_client: MlflowClient, flow_run_id) -> dict:
    runs = mlflow_client.search_runs(
        [e.experiment_id for e in mlflow_client.search_experiments()],
        filter_string=f"tags.`rlhf.prefect_flow_run_id` = '{flow_run_id}'")
    assert len(runs) == 1, runs
    return runs[0].data.params


def test_parameter_schema_has_typed_sections_with_descriptions(served):
    _, deployment, _, _ = served
    schema = deployment.parameter_openapi_schema
    props, defs = schema["properties"], schema["definitions"]
    assert SECTIONS <= set(props)
    assert props["ppo"]["$ref"] == "#/definitions/PPOConfig"
    assert props["ppo"]["description"].startswith("PPO")
    kl = defs["PPOConfig"]["properties"]["kl_coef"]
    assert kl["type"] == "number" and "KL" in kl["description"]
    # the form starts from the served config (demo on), not a bare config's defaults
    assert deployment.parameters["demo"]["enabled"] is True
    assert deployment.parameters["ppo"]["iterations"] == 3


def test_run_with_no_parameters_runs_the_served_config(served):
    client, deployment, mlflow_client, log = served
    run = _run(client, deployment)
    assert run.state.type.value == "COMPLETED", log.read_text()[-3000:]
    params = _parent_params(mlflow_client, run.id)
    assert params["demo.enabled"] == "True" and params["ppo.iterations"] == "3"


def test_one_field_override_keeps_the_rest_and_shows_in_mlflow(served):
    client, deployment, mlflow_client, log = served
    run = _run(client, deployment, {"ppo": {"kl_coef": 0.123}})
    assert run.state.type.value == "COMPLETED", log.read_text()[-3000:]
    params = _parent_params(mlflow_client, run.id)
    assert params["ppo.kl_coef"] == "0.123"
    assert params["ppo.iterations"] == "3" and params["ppo.rollout_batch_size"] == "16"
