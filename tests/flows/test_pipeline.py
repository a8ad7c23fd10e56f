"""End to end: the whole flow on a tiny demo config under prefect_test_harness."""

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from tasks.config.pipeline_config import load_config
from tasks.pipeline.stages.critic_init import FROM_RM
from tests.shared import TEST_CONFIG as CONFIG
from tests.shared import pipeline_stages, ppo_iteration_metrics, registered_models_panel


@pytest.fixture(scope="module")
def pipeline_result(tmp_path_factory, prefect_api):
    from flows.pipeline import rlhf_pipeline

    tmp = tmp_path_factory.mktemp("e2e")
    uri = f"sqlite:///{tmp}/mlflow.db"
    cfg = load_config(CONFIG, [f"tracking.tracking_uri={uri}", f"tracking.workdir={tmp}/runs"])
    result = rlhf_pipeline(config=cfg)
    return result, MlflowClient(uri), cfg


def cfg_value(dotted: str):
    from tasks.config.pipeline_config import flatten

    return flatten(load_config(CONFIG).model_dump(mode="json"))[dotted]


def test_every_stage_has_a_child_run_with_metrics(pipeline_result):
    result, client, _ = pipeline_result
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    by_stage = {r.data.tags["rlhf.stage"]: r for r in children}
    assert sorted(by_stage) == sorted(pipeline_stages())
    for stage, run in by_stage.items():
        assert run.info.status == "FINISHED", stage
        assert run.data.metrics, f"{stage} logged no metric"
    # each child run carries its own stage's settings, so two runs' stages compare in MLflow
    assert by_stage["ppo"].data.params["ppo.kl_coef"] == str(cfg_value("ppo.kl_coef"))
    assert "sft.epochs" in by_stage["sft"].data.params
    assert "reward.use_margin" in by_stage["reward_model"].data.params
    assert "sft.epochs" not in by_stage["ppo"].data.params
    for name in ppo_iteration_metrics():
        history = client.get_metric_history(by_stage["ppo"].info.run_id, name)
        assert [m.step for m in history] == [1, 2, 3], name
    for key in ("eval/rm_accuracy", "eval/rm_score_sft", "eval/rm_score_policy",
                "eval/kl_to_ref", "eval/judge_win_rate"):
        assert key in parent.data.metrics, key


def test_policy_weights_changed_and_model_registered(pipeline_result):
    result, client, cfg = pipeline_result
    workdir = Path(result.workdir)
    sft_w = load_file(str(workdir / "sft" / "model" / "model.safetensors"))
    ppo_w = load_file(str(workdir / "ppo" / "policy" / "model.safetensors"))
    assert sft_w.keys() == ppo_w.keys()
    assert any(not torch.equal(sft_w[k], ppo_w[k]) for k in sft_w)
    version = client.get_model_version_by_alias(cfg.tracking.registered_policy, "champion")
    assert version.run_id == result.stages["register"].run_id
    # the first registered policy is champion by the "no champion yet" rule, said in its tags
    assert version.tags["rlhf.register.decision"] == "first"
    assert version.aliases == ["champion"]  # promoted: no longer the challenger
    scorer = client.get_run(result.parent_run_id).data.tags["rlhf.eval.scorer"]
    assert scorer.startswith("judge:demo@16 prompts:"), scorer


def test_parent_run_shows_registered_versions(pipeline_result):
    """The parent run's "Registered models" panel in the MLflow 3 UI lists the policy and
    reward-model versions; the versions still record the register run and the parent."""
    result, client, cfg = pipeline_result
    reg = result.stages["register"]
    policy, rm = ((name, str(client.get_model_version_by_alias(name, alias).version))
                  for name, alias in ((cfg.tracking.registered_policy, "champion"),
                                      (cfg.tracking.registered_reward_model, "challenger")))
    shown = registered_models_panel(client, result.parent_run_id)
    assert {policy, rm} <= shown
    version = client.get_model_version(*policy)
    assert version.run_id == reg.run_id
    assert version.tags["rlhf.parent_run_id"] == result.parent_run_id


def test_rerun_with_same_id_skips_completed_stages(pipeline_result):
    from flows.pipeline import rlhf_pipeline

    result, client, cfg = pipeline_result
    again = rlhf_pipeline(config=cfg, resume_run_id=result.parent_run_id)
    assert all(stage.skipped for stage in again.stages.values())
    ppo_run = result.stages["ppo"].run_id
    steps = [m.step for m in client.get_metric_history(ppo_run, "objective/kl")]
    assert steps == [1, 2, 3]


def test_the_flow_run_graph_is_the_recipe(pipeline_result):
    """Prefect's graph of the run (each task run's upstream inputs, read from its API): one
    edge per direct data dependency, none from prepare into every stage and none from every
    stage into finish."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    result, client, _ = pipeline_result
    flow_run_id = client.get_run(result.parent_run_id).data.tags["rlhf.prefect_flow_run_id"]
    with get_client(sync_client=True) as prefect:
        task_runs = prefect.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    name = {str(t.id): t.name.rsplit("-", 1)[0]
            for t in task_runs}
    edges = sorted((name[str(inp.id)], name[str(t.id)]) for t in task_runs
                   for inputs in t.task_inputs.values() for inp in inputs
                   if getattr(inp, "input_type", "") == "task_run" and str(inp.id) in name)
    assert edges == sorted([
        ("prepare", "validate"), ("validate", "sft"), ("sft", "reward_model"),
        ("reward_model", "reward_norm"), ("reward_model", "critic_init"),
        ("sft", "judge_model"), ("judge_model", "ppo"),
        ("reward_norm", "ppo"), ("critic_init", "ppo"), ("ppo", "evaluate"),
        ("evaluate", "register"), ("register", "finish")])


def test_the_run_has_its_own_summary_artifact(pipeline_result):
    """Where a Prefect user lands: the flow run's own artifact (no task run) with the stage
    table, the registry decision and why, and the MLflow links."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    result, client, _ = pipeline_result
    flow_run_id = client.get_run(result.parent_run_id).data.tags["rlhf.prefect_flow_run_id"]
    with get_client(sync_client=True) as prefect:
        found = [a for a in prefect.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["rlhf-run-summary"]))) if str(a.flow_run_id) ==
            flow_run_id]
    assert len(found) == 1 and found[0].task_run_id is None, found
    text = found[0].data
    assert all(f"| {stage} | " in text for stage in pipeline_stages()), text
    assert "promoted to champion" in text and result.registered.reason in text, text
    assert result.parent_run_id in text and "workflowType=machine_learning" in text, text
    assert f"- critic: {FROM_RM}" in text, text  # where the critic started, and why
