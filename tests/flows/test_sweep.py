"""`rlhf sweep`: shared stages run once, every point is its own parent run, failures recorded."""

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tasks.config.pipeline_config import ConfigError, grid_points, load_config, parse_grid

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "test.yaml"
SHARED = {"validate", "sft", "reward_model", "reward_norm", "judge_model"}  # + health's judge


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, prefect_api):
    from flows.pipeline import rlhf_sweep

    tmp = tmp_path_factory.mktemp("sweep")
    uri = f"sqlite:///{tmp}/mlflow.db"
    cfg = load_config(CONFIG, [f"tracking.tracking_uri={uri}", f"tracking.workdir={tmp}/r",
                               "ppo.advantage_estimator=reinforce_baseline",
                               "tracking.register_models=false"])
    # a temperature of 1e-40 overflows the sampler's logits / T: that point fails at run time
    out = rlhf_sweep(config=cfg, grid={"ppo.temperature": [0.7, 1e-40]}, sweep_id="sw-test")
    return out, MlflowClient(uri)


def children(client, run):
    found = client.search_runs([run.info.experiment_id],
                               filter_string=f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")
    return {r.data.tags["rlhf.stage"]: r for r in found}


def test_shared_stages_run_once_and_points_reuse_them(sweep):
    out, client = sweep
    exp = out.experiment_id
    kind = client.get_experiment(exp).tags["mlflow.experimentKind"]
    assert kind == "custom_model_development"  # the MLflow UI opens on the runs table
    stage_runs = client.search_runs([exp], filter_string="tags.`rlhf.stage` != ''")
    counts = {}
    for run in stage_runs:
        counts[run.data.tags["rlhf.stage"]] = counts.get(run.data.tags["rlhf.stage"], 0) + 1
    assert all(counts[s] == 1 for s in SHARED), counts
    assert counts["ppo"] == 2 and counts["critic_init"] == 2
    shared = client.get_run(out.parent_run_id)
    assert set(children(client, shared)) == SHARED
    points = client.search_runs([exp], filter_string="tags.`rlhf.sweep_id` = 'sw-test'")
    points = [p for p in points if "rlhf.sweep_point" in p.data.tags]
    assert len(points) == 2
    for point in points:
        assert set(children(client, point)) <= {"critic_init", "ppo", "evaluate"}
        assert point.data.tags["rlhf.sweep_shared_run_id"] == out.parent_run_id


def test_a_failed_point_is_named_and_the_other_finishes(sweep):
    out, client = sweep
    assert out.failed == ["temperature=1e-40,seed=0"]
    by_point = {r["point"]: r for r in out.rows}
    good = by_point["temperature=0.7,seed=0"]
    assert good["status"] == "FINISHED" and 0.0 <= good["eval/judge_win_rate"] <= 1.0
    assert good["memory/peak_rss_gb"] > 0 and good["wall_s"] > 0
    assert by_point["temperature=1e-40,seed=0"]["status"] == "FAILED"
    failed_run = [r for r in client.search_runs(
        [out.experiment_id], filter_string="tags.`rlhf.sweep_id` = 'sw-test'")
        if r.data.tags.get("rlhf.sweep_point", "").find("1e-40") >= 0]
    assert failed_run and failed_run[0].info.status == "FAILED"
    assert "temperature=1e-40,seed=0" in out.markdown


def test_summary_artifacts_on_the_sweep_run(sweep):
    out, client = sweep
    names = {a.path for a in client.list_artifacts(out.parent_run_id, "sweep")}
    assert {"sweep/summary.md", "sweep/points.json", "sweep/summary.json"} <= names
    assert [a.path for a in client.list_artifacts(out.parent_run_id, "plots")] == \
        ["plots/sweep_frontier.png"]
    group = out.groups[0]
    assert group["n_seeds"] == 1 and group["ci95"] is None


def test_grid_refuses_shared_stage_keys_and_names_bad_points():
    base = load_config(CONFIG)
    with pytest.raises(ConfigError, match="only ppo.\\* and eval.\\* may vary"):
        grid_points(base, parse_grid(["sft.epochs=1,2"]), [0])
    with pytest.raises(ConfigError, match="sweep point ppo.advantage_estimator=\"rloo\""):
        grid_points(base, parse_grid(["ppo.advantage_estimator=gae,rloo"]), [0])
    points = grid_points(base, parse_grid(["ppo.kl_coef=0.02,0.05"]), [3, 4])
    assert [(o["ppo.kl_coef"], c.seed) for o, c in points] == \
        [(0.02, 3), (0.02, 4), (0.05, 3), (0.05, 4)]
