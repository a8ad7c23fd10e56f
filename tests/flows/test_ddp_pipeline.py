"""The pipeline with model.nproc=2: SFT, the reward model and PPO run as 2 gloo ranks under
torchrun, started and watched by their Prefect tasks. Only rank 0 logs (one value per
step), writes checkpoints and outputs; both ranks killed mid-stage fail the stage with the
launcher's report, and --resume at the same world size continues from rank 0's checkpoint
without logging a step twice. (That the resumed weights equal an uninterrupted run's, and
that 2 ranks make the 1-process update, is tested in tests/rlhf_core/test_distributed.py and,
for PPO, tests/rlhf_core/test_ppo_dist.py.)"""

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tasks.config.pipeline_config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "test.yaml"
# 4 SFT steps and 4 RM steps, each logged; checkpoints after step 2; PPO and evaluation short
OVERRIDES = ["model.nproc=2", "model.torch_threads=2", "sft.log_every=1",
             "sft.checkpoint_every=2", "reward.log_every=1", "reward.checkpoint_every=2",
             "ppo.iterations=2", "ppo.sample_every=1", "ppo.num_samples=2",
             "tracking.register_models=false", "tracking.keep_resume_state=true"]
RANK_STAGES = ("sft", "reward_model")


@pytest.fixture(scope="module")
def crashed_then_resumed(prefect_api, tmp_path_factory):
    """Both RM ranks SIGKILLed after step 3 (checkpoint at 2), then `--resume`."""
    from flows.pipeline import rlhf_pipeline

    tmp = tmp_path_factory.mktemp("ddp_e2e")
    uri = f"sqlite:///{tmp}/mlflow.db"
    cfg = load_config(CONFIG, OVERRIDES + [f"tracking.tracking_uri={uri}",
                                           f"tracking.workdir={tmp}/runs"])
    mp = pytest.MonkeyPatch()
    mp.setenv("RLHF_CRASH_AT", "reward_model:step:3")
    try:
        rlhf_pipeline(config=cfg)
        error = None
    except RuntimeError as err:
        error = err
    finally:
        mp.undo()
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    parent_id = client.search_runs([exp.experiment_id],
                                   filter_string="tags.`rlhf.config_hash` != ''")[0].info.run_id
    return error, rlhf_pipeline(config=cfg, resume_run_id=parent_id), client


def _children(client: MlflowClient, parent_id: str) -> dict:
    parent = client.get_run(parent_id)
    runs = client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")
    return {r.data.tags["rlhf.stage"]: r for r in runs}


def test_killed_ranks_fail_the_stage_with_the_launchers_report(crashed_then_resumed):
    error, _, _ = crashed_then_resumed
    assert error is not None
    assert "reward_model: torchrun exited with code" in str(error)
    assert "SIGKILL" in str(error)


def test_resumed_two_rank_stages_log_once_per_step_and_checkpoint_once(crashed_then_resumed):
    _, result, client = crashed_then_resumed
    assert result.stages["sft"].skipped and not result.stages["reward_model"].skipped
    children = _children(client, result.parent_run_id)
    assert all(r.info.status == "FINISHED" for r in children.values())
    workdir = Path(result.workdir)
    for stage in RANK_STAGES:
        run_id = children[stage].info.run_id
        for key in ("train/loss", "train/grad_norm", "train/lr"):
            steps = [m.step for m in client.get_metric_history(run_id, key)]
            assert steps == [1, 2, 3, 4], (stage, key, steps)
        assert [p.name for p in (workdir / stage / "checkpoints").iterdir()] == \
            ["step_00000002"], stage
        assert not list((workdir / stage / "ranks").glob("error_rank*"))
        artifacts = [a.path for a in client.list_artifacts(run_id, "checkpoint")]
        assert artifacts and len(artifacts) == len(set(artifacts))
    parent = client.get_run(result.parent_run_id).data.metrics
    assert "eval/rm_accuracy" in parent and "eval/judge_win_rate" in parent


def test_ppo_runs_on_two_ranks_and_rank_0_alone_logs_and_writes(crashed_then_resumed):
    _, result, client = crashed_then_resumed
    run_id = _children(client, result.parent_run_id)["ppo"].info.run_id
    for key in ("objective/kl", "objective/scores", "loss/policy_avg", "judge/score"):
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert steps == [1, 2], (key, steps)  # once per iteration, not once per rank
    ranks = Path(result.workdir) / "ppo" / "ranks"
    assert (ranks / "spec.json").exists() and (ranks / "output.json").exists()
    assert not list(ranks.glob("error_rank*"))
    samples = [a.path for a in client.list_artifacts(run_id, "samples")]
    assert samples == ["samples/all.json", "samples/iter_00001.json", "samples/iter_00002.json"]
    assert result.stages["ppo"].metrics["objective/kl"] == pytest.approx(
        client.get_metric_history(run_id, "objective/kl")[-1].value)


def test_rank_stages_record_the_threads_of_one_rank(crashed_then_resumed):
    """model.torch_threads=2 is each machine's budget: the parent run and the in-process
    stages record 2, the stages rank 0 tagged (2 ranks) record 1 thread each."""
    _, result, client = crashed_then_resumed
    children = _children(client, result.parent_run_id)
    threads = {stage: run.data.tags["rlhf.hw.threads"] for stage, run in children.items()}
    assert threads == {**dict.fromkeys(children, "2"), **dict.fromkeys((*RANK_STAGES, "ppo"),
                                                                       "1")}
    parent = client.get_run(result.parent_run_id).data.tags
    assert parent["rlhf.hw.threads"] == "2"
    assert all(parent[f"rlhf.hw.{k}"] == run.data.tags[f"rlhf.hw.{k}"]
               for run in children.values() for k in ("cpu", "cpu_capability", "torch"))
