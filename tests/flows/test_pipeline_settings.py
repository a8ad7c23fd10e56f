"""Settings reach the code (pipeline): a margin column travels through the data gate into
the reward loss, and ``eval.judge: none`` means no judge in any stage."""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rlhf_core.demo import generate_demo_data
from tasks.config.pipeline_config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "test.yaml"
MARGIN = 6.0  # -log sigmoid(d - 6) >= 6 - d: the RM loss starts far above log 2 = 0.69


@pytest.fixture(scope="module")
def margin_no_judge_run(tmp_path_factory, prefect_api):
    from flows.pipeline import rlhf_pipeline

    tmp = tmp_path_factory.mktemp("settings")
    files = generate_demo_data(tmp / "data", seed=0)
    rows = [json.loads(line) for line in files["preference"].read_text().splitlines()][:128]
    files["preference"].write_text("".join(json.dumps({**r, "margin": MARGIN}) + "\n"
                                           for r in rows))
    sets = [f"data.{role}.path={files[role]}" for role in ("sft", "preference", "prompts")]
    uri = f"sqlite:///{tmp}/mlflow.db"
    cfg = load_config(CONFIG, [f"tracking.tracking_uri={uri}", f"tracking.workdir={tmp}/runs",
                               "data.sft.limit=128", "data.prompts.limit=64",
                               "reward.use_margin=true", "reward.log_every=1",
                               "eval.judge=none", "tracking.register_models=false", *sets])
    result = rlhf_pipeline(config=cfg)
    return result, MlflowClient(uri)


def _children(client, result) -> dict:
    parent = client.get_run(result.parent_run_id)
    runs = client.search_runs([parent.info.experiment_id],
                              f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    return {r.data.tags["rlhf.stage"]: r for r in runs}


def test_margin_column_passes_the_gate_and_reaches_the_reward_loss(margin_no_judge_run):
    result, client = margin_no_judge_run
    cleaned = Path(result.workdir) / "validate" / "preference.jsonl"
    assert json.loads(cleaned.read_text().splitlines()[0])["margin"] == MARGIN
    rm_run = _children(client, result)["reward_model"].info.run_id
    first_loss = client.get_metric_history(rm_run, "train/loss")[0].value
    assert first_loss > MARGIN - 1  # without the margin it starts near 0.69


def test_judge_none_means_no_judge_in_any_stage(margin_no_judge_run):
    result, client = margin_no_judge_run
    runs = [client.get_run(result.parent_run_id), *_children(client, result).values()]
    judged = [(r.data.tags.get("rlhf.stage", "parent"), k) for r in runs
              for k in r.data.metrics if "judge" in k or "gold" in k]
    # the held-out checks' judge is a reward model the pipeline trains, not the data's judge
    assert judged == [("ppo", "check/judge_score")]
    assert "eval/rm_accuracy" in runs[0].data.metrics  # label accuracy stays
    # its evaluation scorer is this run's own reward model: register compares no champion
    rm_run = _children(client, result)["reward_model"].info.run_id
    assert runs[0].data.tags["rlhf.eval.scorer"].startswith(f"reward_model:{rm_run}@16 ")
