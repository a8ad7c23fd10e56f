"""The torchrun watcher of a data-parallel stage: a failed or cancelled launch leaves no
process of its group behind, and the stage fails with the rank's own error."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from tasks.platform.prefect import launch


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _script(tmp_path, body: str) -> list[str]:
    """A launcher stand-in: a background child (its own stdout closed) and ``body``."""
    return ["bash", "-c", f"sleep 300 >/dev/null 2>&1 & echo $! > {tmp_path}/child.pid; {body}"]


def test_a_failed_launch_kills_its_group_and_names_the_exit_and_output(tmp_path):
    with pytest.raises(RuntimeError, match=r"(?s)sft: torchrun exited with code 3.*hello"):
        launch.watch(_script(tmp_path, "echo hello; exit 3"), dict(os.environ), "sft", tmp_path)
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_cancellation_while_streaming_kills_the_group(tmp_path, monkeypatch):
    def cancelled(*args, **kwargs):
        raise KeyboardInterrupt  # what arrives in the task when its run is cancelled

    monkeypatch.setattr(launch, "print", cancelled, raising=False)
    with pytest.raises(KeyboardInterrupt):
        launch.watch(_script(tmp_path, "echo started; wait"), dict(os.environ), "sft",
                     tmp_path)
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_the_first_rank_error_is_raised_with_its_type_and_message(tmp_path):
    first = {"rank": "1", "type": "FloatingPointError",
             "message": "non-finite sft loss at step 3: nan", "traceback": ""}
    later = {"rank": "0", "type": "DistBackendError", "message": "connection closed",
             "traceback": ""}
    (tmp_path / "error_rank1.json").write_text(json.dumps(first))
    time.sleep(0.01)
    (tmp_path / "error_rank0.json").write_text(json.dumps(later))
    cmd = [sys.executable, "-c", "raise SystemExit(1)"]
    with pytest.raises(FloatingPointError, match="sft rank 1: .*non-finite sft loss at step 3"):
        launch.watch(cmd, dict(os.environ), "sft", tmp_path)
    (tmp_path / "error_rank1.json").unlink()
    with pytest.raises(RuntimeError, match="sft rank 0: DistBackendError: connection closed"):
        launch.watch(cmd, dict(os.environ), "sft", tmp_path)


def test_a_rank_records_its_error_for_the_task(tmp_path, monkeypatch):
    from tasks.config.pipeline_config import PipelineConfig
    from tasks.pipeline.stages import rank_main

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "0")
    ctx = {"tracking_uri": f"sqlite:///{tmp_path}/m.db", "experiment_id": "0",
           "parent_run_id": "p", "workdir": str(tmp_path), "seed": 0}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"stage": "sft", "run_id": "r", "ctx": ctx, "inputs": {},
                                "cfg": PipelineConfig().model_dump(mode="json"),
                                "output": str(tmp_path / "out.json"), "errors": str(tmp_path)}))
    assert rank_main.main([str(spec)]) == 1
    with pytest.raises(RuntimeError, match="sft rank 0: RuntimeError: .*runs under torchrun"):
        launch.watch([sys.executable, "-c", "raise SystemExit(1)"], dict(os.environ), "sft",
                     tmp_path)


def test_a_launch_leaves_the_tasks_own_process_as_it_was(tmp_path, monkeypatch):
    """The ranks get their own environment (1 OpenMP thread each by default); the task's
    process, which runs the later stages, keeps its environment and torch thread count."""
    import torch

    from tasks.config.pipeline_config import PipelineConfig
    from tasks.platform.mlflow.runs import RunContext

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = {}

    def fake_watch(cmd, env, stage, folder):
        seen.update(env=env, cmd=cmd)
        (folder / "output.json").write_text("{}")

    monkeypatch.setattr(launch, "watch", fake_watch)
    before, threads = dict(os.environ), torch.get_num_threads()
    ctx = RunContext(tracking_uri="sqlite:///x.db", experiment_id="0", parent_run_id="p",
                     workdir=str(tmp_path), seed=0)
    cfg = PipelineConfig.model_validate({"model": {"nproc": 2}})
    assert launch.run_ranks(ctx, cfg, "sft", "r", {}) == {}
    assert seen["env"]["OMP_NUM_THREADS"] == "1" and "--nproc-per-node=2" in seen["cmd"]
    assert dict(os.environ) == before and torch.get_num_threads() == threads
