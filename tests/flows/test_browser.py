"""The newcomer's path through the UIs, in headless Chromium against a real Prefect server (its
UI) and a real MLflow tracking server: `rlhf serve`, Deployments -> the pipeline -> Run ->
Custom run (its data section says what to enter) with ppo -> kl_coef changed, Submit; the
run completes under a name that says what changed; its page shows the run's own summary
artifact; MLflow's parent run page shows the changed param; the retrain deployment's Quick
run runs the served config at once and, with no new batch, says how a batch is made. Skipped,
saying why, where Chromium or Playwright is missing."""

import pytest
from mlflow.tracking import MlflowClient

from tests import ui
from tests.flows.prefect_procs import wait_run

pytestmark = pytest.mark.skipif(ui.missing() is not None, reason=ui.missing() or "")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    with ui.served(tmp_path_factory.mktemp("browser")) as srv, ui.browser() as page:
        yield srv, page


def test_the_forms_data_section_says_what_to_enter(session):
    """Each source a path to fill, with an example; no 'Property is type "None"' choice."""
    srv, page = session
    data = ui.form_section(page, srv, "data", "model")
    assert "Property is type" not in data and "None" not in data, data
    assert "every path left empty runs on the demo's data" in data
    for source, example in (("Sft", "data/sft.jsonl"), ("Preference", "data/pairs.parquet"),
                            ("Prompts", "data/prompts.csv"), ("Eval Prompts", "heldout.jsonl"),
                            ("Preference Eval", "pairs_eval.jsonl")):
        assert f"{source} (Optional)" in data and example in data, source


@pytest.fixture(scope="module")
def custom(session):
    """The Custom run with ppo -> kl_coef 0.07 (it registers the first champion)."""
    srv, page = session
    run = wait_run(srv.client, ui.custom_run(page, srv, "Kl Coef", "0.07"), timeout=400)
    assert run.state.type.value == "COMPLETED", srv.log.read_text()[-3000:]
    return run


def test_a_custom_run_from_the_form_reaches_mlflow_and_summarises_itself(session, custom):
    srv, page = session
    run, flow_run_id = custom, str(custom.id)
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


def test_the_retrain_quick_run_runs_and_names_the_next_step(session, custom):
    """After the pipeline run above registered a champion: Quick run -> a round with nothing
    new, whose decision artifact names how a batch is made."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    srv, page = session
    run = wait_run(srv.client, ui.quick_run(page, srv, "retrain/test"), timeout=400)
    assert run.state.type.value == "COMPLETED", srv.log.read_text()[-3000:]
    assert run.name.endswith("-nothing-new"), run.name
    notes = srv.client.read_artifacts(artifact_filter=ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
    text = "\n".join(str(a.data) for a in notes)
    for step in ("rlhf collect", "rlhf label pull", "rlhf demo-batch"):
        assert step in text, text
