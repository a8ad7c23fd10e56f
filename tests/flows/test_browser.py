"""The newcomer's path through the UIs, in headless Chromium against a real Prefect server (its
UI) and a real MLflow tracking server: `rlhf serve`, Deployments -> the pipeline -> Run ->
Custom run with ppo -> kl_coef changed, Submit; the run completes under a name that says what
changed; its page shows the run's own summary artifact; MLflow's parent run page shows the
changed param. Skipped, saying why, where Chromium or Playwright is missing."""

import pytest
from mlflow.tracking import MlflowClient

from tests import ui
from tests.flows.prefect_procs import wait_run

pytestmark = pytest.mark.skipif(ui.missing() is not None, reason=ui.missing() or "")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    with ui.served(tmp_path_factory.mktemp("browser")) as srv, ui.browser() as page:
        yield srv, page


def test_a_custom_run_from_the_form_reaches_mlflow_and_summarises_itself(session):
    srv, page = session
    flow_run_id = ui.custom_run(page, srv, "Kl Coef", "0.07")
    run = wait_run(srv.client, flow_run_id, timeout=400)
    assert run.state.type.value == "COMPLETED", srv.log.read_text()[-3000:]
    assert run.name.startswith("rlhf-demo-gpt2-demo-data-") and \
        run.name.endswith(" kl_coef=0.07"), run.name

    page_text = ui.flow_run_page(page, srv, flow_run_id)
    assert run.name in page_text
    summary = ui.run_summary(page, srv, flow_run_id)
    assert "promoted to champion" in summary and "| register |" not in summary  # rendered
    assert all(stage in summary for stage in ("validate", "ppo", "register")), summary

    mlflow = MlflowClient(srv.mlflow)
    exp = mlflow.get_experiment_by_name("rlhf-test")
    (parent,) = mlflow.search_runs(
        [exp.experiment_id], filter_string=f"tags.`rlhf.prefect_flow_run_id` = '{run.id}'")
    assert parent.info.run_id in summary  # the summary links the MLflow parent run
    assert ui.mlflow_param(page, srv.mlflow, exp.experiment_id, parent.info.run_id,
                           "ppo.kl_coef") == "0.07"
