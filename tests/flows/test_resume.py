"""Crash anywhere, resume, get the same bits: the pipeline process is SIGKILLed at six
points (mid-SFT, mid-reward-model, between stages, during a checkpoint save, mid-PPO
iteration, during PPO's held-out check), resumed each time, and compared with uninterrupted
runs."""

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from tasks.config.pipeline_config import load_config
from tests.shared import pipeline_stages, rlhf_in_process
from tests.stores import seed_sqlite_store

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "test.yaml"
# 4 SFT steps and 4 RM steps (checkpoints at step 2), 3 PPO iterations (checkpoints at 1, 2),
# kept after the run finishes (tracking.keep_resume_state) for the checks below
OVERRIDES = ["model.torch_threads=2", "sft.log_every=1", "sft.checkpoint_every=2",
             "reward.log_every=1", "reward.checkpoint_every=2", "ppo.checkpoint_every=1",
             "tracking.register_models=false", "tracking.keep_resume_state=true"]
KILL_POINTS = ["sft:step:3", "reward_model:step:3", "after:reward_norm", "checkpoint:ppo:2",
               "ppo:rollout:3", "ppo:check:3"]


def policy_hash(workdir: Path) -> str:
    tensors = load_file(str(workdir / "ppo" / "policy" / "model.safetensors"))
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].contiguous().numpy().tobytes())
    return digest.hexdigest()


def stage_outputs(workdir: Path) -> dict[str, int]:
    """mtime of every file of every finished stage's output folder (changes if re-run)."""
    return {str(p): p.stat().st_mtime_ns for stage in ("sft", "reward_model", "critic_init")
            for p in (workdir / stage / "model").rglob("*") if p.is_file()}


def run_in_process(tmp: Path, name: str):
    from flows.pipeline import rlhf_pipeline

    uri = f"sqlite:///{tmp}/{name}.db"
    cfg = load_config(CONFIG, OVERRIDES + [f"tracking.tracking_uri={uri}",
                                           f"tracking.workdir={tmp}/{name}"])
    return rlhf_pipeline(config=cfg)


def run_args(args: list[str]) -> list[str]:
    return ["run", "--config", str(CONFIG), *[a for o in OVERRIDES for a in ("--set", o)], *args]


def rlhf_cli(args: list[str], env: dict, crash_at: str | None) -> subprocess.CompletedProcess:
    env = {**env, "RLHF_CRASH_AT": crash_at or ""}
    return subprocess.run([sys.executable, "-m", "cli", *run_args(args)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def uninterrupted(prefect_api, tmp_path_factory) -> dict:
    """One uninterrupted in-process run: the reference of both tests below."""
    return run_in_process(tmp_path_factory.mktemp("uninterrupted"), "reference")


def test_rerun_from_the_recorded_config_gives_identical_weights(uninterrupted, tmp_path):
    """Two uninterrupted runs, the second from the config recorded on the first's parent run
    (`rlhf run --config <recorded config>`): same final weights, bit for bit."""
    from flows.pipeline import rlhf_pipeline

    first = uninterrupted
    client = MlflowClient(first.tracking_uri)
    parent = client.get_run(first.parent_run_id)
    recorded = client.download_artifacts(parent.info.run_id, "config/resolved_config.json",
                                         str(tmp_path))
    for tag in ("rlhf.config_hash", "rlhf.seed", "rlhf.version.torch"):
        assert tag in parent.data.tags, tag
    second = rlhf_pipeline(config=load_config(Path(recorded), []))
    assert second.parent_run_id != first.parent_run_id
    assert policy_hash(Path(second.workdir)) == policy_hash(Path(first.workdir))


def test_sigkill_at_six_points_then_resume_equals_uninterrupted(prefect_api, uninterrupted,
                                                                tmp_path, capfd, threads_kept):
    reference = policy_hash(Path(uninterrupted.workdir))
    uri = f"sqlite:///{tmp_path}/killed.db"
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": uri,
           "PREFECT_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
    base = ["--set", f"tracking.workdir={tmp_path}/killed", "--set", "tracking.run_name=kill"]
    seed_sqlite_store(uri)
    client = MlflowClient(uri)
    run_id, finished_outputs = None, {}
    for i, point in enumerate(KILL_POINTS):
        # alternate the two ways of resuming: --resume <id>, and same run name + config
        args = base + (["--resume", run_id] if run_id and i % 2 else [])
        proc = rlhf_cli(args, env, crash_at=point)
        assert proc.returncode == -signal.SIGKILL, f"{point}: {proc.stderr[-3000:]}"
        if run_id is None:
            parents = client.search_runs(
                [client.get_experiment_by_name("rlhf-test").experiment_id],
                filter_string="tags.`rlhf.run_name` = 'kill'")
            (run_id,) = [r.info.run_id for r in parents]
        workdir = tmp_path / "killed" / run_id
        now = stage_outputs(workdir)
        assert all(now[p] == t for p, t in finished_outputs.items()), f"re-ran before {point}"
        finished_outputs = now
    # the resume that finishes runs in this process (no crash to survive: no new process)
    proc = rlhf_in_process(run_args(base + ["--resume", run_id]), capfd,
                           PREFECT_API_URL=prefect_api, MLFLOW_TRACKING_URI=uri,
                           RLHF_CRASH_AT="")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr

    parent = client.get_run(run_id)
    assert parent.info.status == "FINISHED"
    assert all(stage_outputs(workdir)[p] == t for p, t in finished_outputs.items())
    assert policy_hash(workdir) == reference  # bit for bit

    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'")
    by_stage = {r.data.tags["rlhf.stage"]: r for r in children}
    # one child per stage, reopened, never doubled
    assert len(children) == len(by_stage) and sorted(by_stage) == sorted(pipeline_stages())
    for run in [parent, *children]:
        for key in run.data.metrics:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            assert len(steps) == len(set(steps)), (run.data.tags.get("rlhf.stage"), key, steps)
    history = {s: [m.step for m in client.get_metric_history(by_stage[s].info.run_id, k)]
               for s, k in (("sft", "train/loss"), ("reward_model", "train/loss"),
                            ("ppo", "objective/kl"))}
    assert history == {"sft": [1, 2, 3, 4], "reward_model": [1, 2, 3, 4], "ppo": [1, 2, 3]}
    # the kill during the iteration-2 save left the iteration-1 checkpoint loadable; the last
    # N (2) are kept
    kept = sorted(p.name for p in (workdir / "ppo" / "checkpoints").glob("step_*"))
    assert kept == ["step_00000001", "step_00000002"]
