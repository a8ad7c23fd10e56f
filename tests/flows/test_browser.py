"""The newcomer's path through the UIs, in headless Chromium against a real Prefect server (its
UI) and a real MLflow tracking server: `rlhf serve`, Deployments -> the pipeline -> Run ->
Custom run (its data section says what to enter; no field is a choice of "None") with ppo ->
kl_coef changed and a login with its password typed into tracking -> tracking_uri, Submit;
the run completes under a name that says what changed, the same name as its MLflow parent
run and its summary's heading, with the password as *** there, in the Runs list, in the
run's logs and in `rlhf serve`'s output; its page shows the run's own summary artifact, whose
MLflow link opens in "Model training" mode; MLflow's parent run page shows the changed
param; the retrain deployment's Quick run runs the served config at once and, with no new
batch, says how a batch is made. Skipped, saying why, where Chromium or Playwright is
missing."""

import re

import pytest
from mlflow.tracking import MlflowClient

from tests import ui
from tests.flows.prefect_procs import wait_run

pytestmark = pytest.mark.skipif(ui.missing() is not None, reason=ui.missing() or "")
PASSWORD = "s3cret-Pw7"


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    # INFO: the flow runs' own lines (the overrides line) reach the API and serve's output
    with ui.served(tmp_path_factory.mktemp("browser"), log_level="INFO") as srv, \
            ui.browser() as page:
        yield srv, page


def test_the_forms_data_section_says_what_to_enter(session):
    """Each source a path to fill, with an example; no 'Property is type "None"' choice in
    the data section, nor anywhere else in the form."""
    srv, page = session
    data = ui.form_section(page, srv, "data", "model")
    assert "Property is type" not in data and "None" not in data, data
    assert "every path left empty runs on the demo's data" in data
    for source, example in (("Sft", "data/sft.jsonl"), ("Preference", "data/pairs.parquet"),
                            ("Prompts", "data/prompts.csv"), ("Eval Prompts", "heldout.jsonl"),
                            ("Preference Eval", "pairs_eval.jsonl")):
        assert f"{source} (Optional)" in data and example in data, source
    form = ui.custom_run_form(page, srv)
    assert form.count('Property is type "None"') == 0, form
    for field in ("Tokenizer", "Torch Threads", "Lora", "Max Samples", "Micro Batch Size",
                  "Tracking Uri", "Run Name", "Gc Schedule", "Nodes", "resume_run_id"):
        assert f"\n{field} (Optional)\n" in form, field


@pytest.fixture(scope="module")
def custom(session):
    """The Custom run with ppo -> kl_coef 0.07 and a login in tracking -> tracking_uri (it
    registers the first champion)."""
    srv, page = session
    login = srv.mlflow.replace("http://", f"http://carol:{PASSWORD}@")
    run = wait_run(srv.client, ui.custom_run(page, srv, {"Kl Coef": "0.07",
                                                         "Tracking Uri": login}), timeout=400)
    assert run.state.type.value == "COMPLETED", srv.log.read_text()[-3000:]
    return run


def test_a_custom_run_from_the_form_reaches_mlflow_and_summarises_itself(session, custom):
    srv, page = session
    run, flow_run_id = custom, str(custom.id)
    shown = srv.mlflow.replace("http://", "http://carol:***@")
    assert re.fullmatch(r"\d{8}-\d{6}-demo-gpt2-demo-data-\w{6} kl_coef=0\.07 "
                        rf"tracking_uri={re.escape(shown)}", run.name), run.name

    page_text = ui.flow_run_page(page, srv, flow_run_id)
    assert run.name in page_text
    summary = ui.run_summary(page, srv, flow_run_id)
    assert "promoted to champion" in summary and "| register |" not in summary  # rendered
    assert all(stage in summary for stage in ("validate", "ppo", "register")), summary

    mlflow = MlflowClient(srv.mlflow)
    exp = mlflow.get_experiment_by_name("rlhf-test")
    (parent,) = mlflow.search_runs(
        [exp.experiment_id], filter_string=f"tags.`rlhf.prefect_flow_run_id` = '{run.id}'")
    assert parent.info.run_name == run.name  # one name in both UIs, and the summary's heading
    assert ui.summary_markdown(srv, flow_run_id).startswith(f"# {run.name}\n")
    assert parent.info.run_id in summary  # the summary links the MLflow parent run
    assert ui.mlflow_param(page, srv.mlflow, exp.experiment_id, parent.info.run_id,
                           "ppo.kl_coef") == "0.07"
    params = parent.data.params  # the form's untouched optional inputs and sections: None
    assert {k: params[k] for k in ("model.lora", "model.tokenizer", "tracking.gc_schedule",
                                   "tracking.run_name", "routing.nodes")} == dict.fromkeys(
        ("model.lora", "model.tokenizer", "tracking.gc_schedule", "tracking.run_name",
         "routing.nodes"), "None")
    link = f"{srv.mlflow}/#/experiments/{exp.experiment_id}/runs/{parent.info.run_id}"
    assert link + "?workflowType=machine_learning" in ui.summary_markdown(srv, flow_run_id)
    training = ui.mlflow_run_page(page, f"{link}?workflowType=machine_learning")
    assert "Model registry" in training and "Observability" not in training
    genai = ui.mlflow_run_page(page, link)  # the mode the link's flag avoids
    assert "Model registry" not in genai and "Observability" in genai


def test_a_password_typed_into_the_form_is_in_no_name_log_or_serve_output(session, custom):
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    srv, page = session
    page.goto(f"{srv.prefect}/runs")
    page.get_by_text(custom.name[:15], exact=False).first.wait_for(timeout=60_000)
    runs_list = page.inner_text("body")
    assert "carol:***@" in runs_list and PASSWORD not in runs_list
    logs = srv.client.read_logs(log_filter=LogFilter(
        flow_run_id=LogFilterFlowRunId(any_=[custom.id])))
    text = "\n".join(log.message for log in logs)
    assert "overrides of the served config" in text and "carol:***@" in text
    assert PASSWORD not in text
    served = srv.log.read_text()  # `rlhf serve`'s output, its flow runs' lines among it
    assert "carol:***@" in served and PASSWORD not in served
    assert PASSWORD not in MlflowClient(srv.mlflow).search_runs(
        [MlflowClient(srv.mlflow).get_experiment_by_name("rlhf-test").experiment_id],
        filter_string=f"tags.`rlhf.prefect_flow_run_id` = '{custom.id}'")[0].info.run_name


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
