"""The tiny pipeline against a real `mlflow server` (SQLite backend, served artifacts) on
localhost, checked through the client/REST API like a user's MLflow UI would show it."""

import json
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from cli.runs import runs_table
from tasks.config.pipeline_config import load_config
from tests import servers
from tests.servers import artifact_paths, stage_children
from tests.shared import TEST_CONFIG as CONFIG
from tests.shared import pipeline_stages, ppo_iteration_metrics, registered_models_panel


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    with servers.mlflow_server(f"sqlite:///{tmp}/server.db", tmp) as url:
        yield url


@pytest.fixture(scope="module")
def served_run(mlflow_server, prefect_api, tmp_path_factory):
    from flows.pipeline import rlhf_pipeline

    tmp = tmp_path_factory.mktemp("served")
    cfg = load_config(CONFIG, [f"tracking.tracking_uri={mlflow_server}",
                               f"tracking.workdir={tmp}/runs",
                               "tracking.system_metrics_interval_s=1"])
    result = rlhf_pipeline(config=cfg)
    return result, MlflowClient(mlflow_server), cfg, tmp


def test_run_tree_metrics_and_histories(served_run):
    result, client, cfg, _ = served_run
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    by_stage = stage_children(client, parent)
    assert sorted(by_stage) == sorted(pipeline_stages())
    assert all(r.info.status == "FINISHED" for r in by_stage.values())
    ppo_id = by_stage["ppo"].info.run_id
    for name in ppo_iteration_metrics() + ["judge/score"]:
        assert [m.step for m in client.get_metric_history(ppo_id, name)] == [1, 2, 3], name
    sft_steps = [m.step for m in client.get_metric_history(by_stage["sft"].info.run_id,
                                                           "train/loss")]
    assert sft_steps and len(sft_steps) == len(set(sft_steps))
    for key in ("eval/accuracy", "eval/rm_accuracy", "train/loss"):
        assert key in by_stage["reward_model"].data.metrics, key
    for key in ("reward/mean", "reward/std"):
        assert key in by_stage["reward_norm"].data.metrics, key
    for key in ("eval/rm_accuracy", "eval/judge_win_rate", "eval/kl_to_ref",
                "eval/rm_score_policy", "eval/eos_rate_policy"):
        assert key in parent.data.metrics, key
    assert any(k.startswith("system/cpu") for k in parent.data.metrics)
    assert any(k.startswith("system/system_memory") for k in parent.data.metrics)
    # params, tags and data digests on the parent
    assert parent.data.params["ppo.kl_coef"] == str(cfg.ppo.kl_coef)
    for tag in ("rlhf.config_hash", "rlhf.seed", "rlhf.version.torch", "rlhf.version.mlflow"):
        assert tag in parent.data.tags, tag
    datasets = {d.dataset.name: d for d in parent.inputs.dataset_inputs}
    assert {"sft", "preference", "prompts", "eval_prompts"} <= set(datasets)
    assert parent.data.tags["rlhf.data_digest.sft"] == datasets["sft"].dataset.digest


def test_artifacts_tables_plots_and_checkpoints(served_run, tmp_path):
    import mlflow

    result, client, _, _ = served_run
    parent = client.get_run(result.parent_run_id)
    by_stage = stage_children(client, parent)
    plot = client.download_artifacts(parent.info.run_id, "plots/ppo_curves.png", str(tmp_path))
    assert Path(plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ppo_files = artifact_paths(client, by_stage["ppo"].info.run_id)
    assert {"samples/iter_00001.json", "samples/iter_00002.json", "samples/all.json",
            "checkpoint/policy/model.safetensors"} <= set(ppo_files)
    assert "checkpoint/model.safetensors" in artifact_paths(client, by_stage["sft"].info.run_id)
    assert any(p.endswith("head.safetensors")
               for p in artifact_paths(client, by_stage["reward_model"].info.run_id))
    mlflow.set_tracking_uri(client.tracking_uri)  # load_table searches the fluent API's store
    table = client.load_table(parent.info.experiment_id, "samples/all.json",
                              run_ids=[by_stage["ppo"].info.run_id])
    assert {"iteration", "prompt", "response", "score", "kl"} <= set(table.columns)
    assert sorted(table["iteration"].unique()) == [1, 2]
    side = client.load_table(parent.info.experiment_id, "eval/side_by_side.json",
                             run_ids=[by_stage["evaluate"].info.run_id])
    assert len(side) == 16 and side["prompt"].str.len().gt(0).all()
    files = artifact_paths(client, by_stage["validate"].info.run_id)
    assert any(p.startswith("data_docs/") and p.endswith(".html") for p in files)


def test_registered_models_load_by_alias_and_work(served_run):
    import mlflow

    result, client, cfg, _ = served_run
    register_run = result.stages["register"].run_id
    policy = client.get_model_version_by_alias(cfg.tracking.registered_policy, "champion")
    rm = client.get_model_version_by_alias(cfg.tracking.registered_reward_model, "challenger")
    assert policy.run_id == rm.run_id == register_run
    # through the server's REST API, as the UI asks: the parent run's "Registered models"
    assert {(policy.name, str(policy.version)), (rm.name, str(rm.version))} <= \
        registered_models_panel(client, result.parent_run_id)
    mlflow.set_tracking_uri(client.tracking_uri)
    policy = mlflow.pyfunc.load_model(f"models:/{cfg.tracking.registered_policy}@champion")
    [answer] = policy.predict(pd.DataFrame({"prompt": ["hello , tell me about the weather ."]}),
                              params={"max_new_tokens": 6, "do_sample": False})
    assert isinstance(answer, str) and not answer.startswith("hello , tell me")
    scorer = mlflow.pyfunc.load_model(f"models:/{cfg.tracking.registered_reward_model}@challenger")
    scores = scorer.predict(pd.DataFrame({"prompt": ["hello", "hi"], "response": ["a", "b"]}))
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)


def test_rlhf_runs_lists_the_run_with_its_metrics(served_run):
    result, client, _, _ = served_run
    text = runs_table("rlhf-test", 5, client.tracking_uri)
    line = next(ln for ln in text.splitlines() if ln.startswith(result.parent_run_id))
    parent = client.get_run(result.parent_run_id)
    win = parent.data.metrics["eval/judge_win_rate"]
    assert "FINISHED" in line and f"{win:.3f}" in line and f" {parent.info.run_name} " in line
    assert f"{client.tracking_uri}/#/experiments/{parent.info.experiment_id}/runs?" \
        "workflowType=machine_learning" in text


def test_prefect_flow_run_name_and_stage_artifacts(served_run):
    """The Prefect UI side: a flow-run name saying what ran, one markdown summary per stage
    linking its MLflow run, the side-by-side evaluation samples as a table artifact."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    result, client, cfg, _ = served_run
    parent = client.get_run(result.parent_run_id)
    flow_run_id = parent.data.tags["rlhf.prefect_flow_run_id"]
    with get_client(sync_client=True) as prefect:
        flow_run = prefect.read_flow_run(flow_run_id)
        artifacts = prefect.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    # one name in both UIs and the run's summary
    assert flow_run.name == parent.info.run_name and \
        flow_run.name.endswith(f"-demo-gpt2-demo-data-{cfg.config_hash()[:6]}")
    by_key = {a.key: a for a in artifacts}
    assert by_key["rlhf-run-summary"].data.startswith(f"# {flow_run.name}\n")
    for stage in pipeline_stages():
        md = by_key[f"rlhf-{stage.replace('_', '-')}"]
        assert md.type == "markdown", stage
        run_id = result.stages[stage].run_id
        link = f"{client.tracking_uri}/#/experiments/{parent.info.experiment_id}/runs/{run_id}" \
            "?workflowType=machine_learning"  # opens in "Model training" mode
        assert link in md.data and "| wall_s |" in md.data, stage
    assert "| eval/judge_win_rate |" in by_key["rlhf-evaluate"].data
    assert f"models:/{cfg.tracking.registered_policy}/" in by_key["rlhf-register"].data
    table = by_key["rlhf-eval-samples"]
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert table.type == "table" and len(rows) == cfg.eval.num_side_by_side
    assert {"prompt", "sft_response", "policy_response"} <= set(rows[0])
