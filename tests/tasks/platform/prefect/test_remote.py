"""Stages outside the task's process (tasks/platform/prefect/remote.py). The torchrun watcher: a
failed or cancelled launch leaves no process of its group behind, and the stage fails with the
rank's own error. On other machines: routing settings are checked before a run, the head gives
up on a node or routed stage that failed or that no worker started (and kills its own ranks),
nodes join the head's static rendezvous, and ranks that would resume from different checkpoints
stop with the reason. The served end-to-end path is in tests/flows/test_remote_stages.py."""

from __future__ import annotations

import json
import os
import sys
import time
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from tasks.config.pipeline_config import PipelineConfig
from tasks.platform.mlflow.runs import RunContext
from tasks.platform.mlflow.tags import ROUTED_FLOW_RUN_TAG
from tasks.platform.prefect import remote


def _ctx(workdir: str) -> RunContext:
    return RunContext(tracking_uri="sqlite:///x.db", experiment_id="1", parent_run_id="p123",
                      workdir=workdir, seed=0)


@pytest.mark.parametrize("routing, message", [
    ({"stages": {"evaluate": "rlhf-stage/gpu"}},
     "routing.stages.evaluate: only sft, reward_model, ppo can run on another machine"),
    ({"stages": {"ppo": "gpu"}}, "routing.stages.ppo='gpu': give a deployment as"),
    ({"nodes": "a/b/c"}, "routing.nodes='a/b/c': give a deployment as"),
])
def test_bad_routing_settings_name_the_field(routing, message):
    with pytest.raises(ValidationError, match=message):
        PipelineConfig.model_validate({"routing": routing})


def test_several_nodes_need_the_deployment_that_starts_them():
    with pytest.raises(ValidationError, match="model.nnodes=2 needs routing.nodes"):
        PipelineConfig.model_validate({"model": {"nnodes": 2}})
    cfg = PipelineConfig.model_validate({"model": {"nnodes": 2},
                                         "routing": {"nodes": "rlhf-stage/nodes"}})
    assert cfg.model.nnodes == 2


def test_routing_without_a_prefect_server_is_refused_before_any_run(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    cfg = PipelineConfig.model_validate({"routing": {"stages": {"ppo": "rlhf-stage/gpu"}},
                                         "tracking": {"tracking_uri": "sqlite:///m.db"}})
    with temporary_settings({PREFECT_API_URL: None}):
        with pytest.raises(remote.RoutingError, match="routing.stages.ppo: stages on other "
                                                      "machines need a Prefect server"), \
                pytest.warns(UserWarning, match="the other machines log into MLflow at "
                                                "sqlite:///m.db, which they reach only"):
            remote.check_deployments(cfg)
        remote.check_deployments(PipelineConfig())  # nothing routed: nothing to check


def test_another_machine_keeps_its_files_under_its_own_folder(monkeypatch, tmp_path):
    ctx = _ctx("/head/runs/p123")
    monkeypatch.delenv(remote.WORKDIR_ENV, raising=False)
    assert remote.local_context(ctx) == ctx  # a shared filesystem: the head's path
    monkeypatch.setenv(remote.WORKDIR_ENV, str(tmp_path))
    assert remote.local_context(ctx).workdir == str(tmp_path / "p123")
    assert remote.local_context(ctx).parent_run_id == "p123"


def test_a_node_joins_the_heads_static_rendezvous(tmp_path):
    node = {"rank": 1, "nnodes": 3, "addr": "head.lan", "port": 29511, "timeout_s": 360}
    cmd = remote.launch_command(4, tmp_path / "spec.json", node)
    assert "--standalone" not in cmd
    for arg in ("--nnodes=3", "--node-rank=1", "--master-addr=head.lan", "--master-port=29511",
                "--rdzv-conf=timeout=360", "--nproc-per-node=4"):
        assert arg in cmd
    assert "--standalone" in remote.launch_command(2, tmp_path / "spec.json")


class _Client:
    """Answers read_flow_run with the next state of a script (the last one repeats)."""

    def __init__(self, *states):
        self.states = list(states)

    def read_flow_run(self, _id):
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return SimpleNamespace(state=state)


def _state(kind: str, message: str | None = None):
    from prefect.client.schemas.objects import State, StateType

    return State(type=StateType[kind], message=message)


def _watched(timeout_s: float) -> remote._Watched:
    run = SimpleNamespace(id="f1", name="brave-otter")
    return remote._Watched(run, "rlhf-stage/gpu", "stage ppo node 1", timeout_s)


def test_a_run_no_worker_starts_is_given_up_after_the_start_timeout():
    watched = _watched(0.2)
    client = _Client(_state("SCHEDULED"))
    assert watched.problem(client) is None
    time.sleep(0.3)
    found = watched.problem(client)
    assert "stage ppo node 1: no worker started flow run brave-otter of rlhf-stage/gpu" in found
    assert "routing.start_timeout_s=0.2" in found


def test_a_started_run_is_not_timed_out_and_a_failed_one_says_why():
    watched = _watched(0.1)
    client = _Client(_state("RUNNING"), _state("RUNNING"),
                     _state("FAILED", "ValueError: bad prompt in row 3"))
    assert watched.problem(client) is None
    time.sleep(0.2)
    assert watched.problem(client) is None  # running: no start timeout any more
    found = watched.problem(client)
    assert found == ("stage ppo node 1: flow run brave-otter of rlhf-stage/gpu ended FAILED: "
                     "ValueError: bad prompt in row 3")
    done = _watched(5)
    assert done.problem(_Client(_state("COMPLETED"))) is None and done.done


def test_a_failed_node_stops_the_heads_ranks(tmp_path):
    cmd = ["bash", "-c", f"sleep 300 >/dev/null 2>&1 & echo $! > {tmp_path}/child.pid; wait"]
    calls = []

    def problem():
        calls.append(time.monotonic())
        return "stage sft node 1: flow run x ended CRASHED: gone" if len(calls) > 1 else None

    start = time.monotonic()
    with pytest.raises(remote.RemoteStageError, match="node 1: flow run x ended CRASHED"):
        remote.watch(cmd, dict(os.environ), "sft", tmp_path, problem=problem)
    assert time.monotonic() - start < 30
    pid = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the head's rank group outlived the failed node")


class _Api:
    """A stand-in Prefect client context: read_flow_run answers from ``states``."""

    def __init__(self, *states):
        self.client = _Client(*states)

    def __call__(self, sync_client=True):
        return self

    def __enter__(self):
        return self.client

    def __exit__(self, *exc):
        return False


@pytest.fixture
def routed(tmp_path, monkeypatch):
    """An MLflow child run and a routed ``ppo`` whose submission and cancellation are
    recorded instead of sent -> (ctx, run id, cancelled flow run ids)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("routed")
    run_id = client.create_run(exp).info.run_id
    ctx = RunContext(tracking_uri=uri, experiment_id=exp, parent_run_id="p", workdir=str(
        tmp_path), seed=0)
    cancelled: list[str] = []
    monkeypatch.setattr(remote, "_submit", lambda *a: SimpleNamespace(id="f1", name="otter"))
    monkeypatch.setattr(remote, "_cancel", cancelled.append)
    monkeypatch.setattr(remote, "POLL_S", 0.01)
    return ctx, run_id, cancelled


def _run_routed(ctx, run_id, monkeypatch, *states):
    import prefect.client.orchestration as orchestration

    monkeypatch.setattr(orchestration, "get_client", _Api(*states))
    cfg = PipelineConfig.model_validate({"routing": {"stages": {"ppo": "rlhf-stage/gpu"}}})
    return remote.run_routed(ctx, cfg, "ppo", run_id, {}, "rlhf-stage/gpu")


def test_a_routed_stage_returns_the_record_the_other_machine_left(routed, monkeypatch):
    ctx, run_id, cancelled = routed
    remote.record_routed(ctx, run_id, {"policy_dir": "/gpu/ppo/policy", "metrics": {}})
    out = _run_routed(ctx, run_id, monkeypatch, _state("PENDING"), _state("RUNNING"),
                      _state("COMPLETED"))
    assert out == {"policy_dir": "/gpu/ppo/policy", "metrics": {}}
    tags = ctx.client().get_run(run_id).data.tags
    assert tags[ROUTED_FLOW_RUN_TAG] == "rlhf-stage/gpu otter (f1)"
    assert cancelled == []


def test_a_routed_run_that_completes_without_a_record_or_fails_is_an_error(routed,
                                                                          monkeypatch):
    ctx, run_id, cancelled = routed
    with pytest.raises(remote.RemoteStageError, match="completed but left no output record"):
        _run_routed(ctx, run_id, monkeypatch, _state("COMPLETED"))
    with pytest.raises(remote.RemoteStageError,
                       match="stage ppo: flow run otter of rlhf-stage/gpu ended CRASHED: oom"):
        _run_routed(ctx, run_id, monkeypatch, _state("RUNNING"), _state("CRASHED", "oom"))
    assert cancelled == ["f1"]  # asked to cancel; an ended run ignores it


def test_an_interrupted_wait_cancels_the_routed_flow_run(routed, monkeypatch):
    ctx, run_id, cancelled = routed

    class Interrupted(_Client):
        def read_flow_run(self, _id):
            raise KeyboardInterrupt

    api = _Api()
    api.client = Interrupted()
    import prefect.client.orchestration as orchestration

    monkeypatch.setattr(orchestration, "get_client", api)
    cfg = PipelineConfig.model_validate({"routing": {"stages": {"ppo": "rlhf-stage/gpu"}}})
    with pytest.raises(KeyboardInterrupt):
        remote.run_routed(ctx, cfg, "ppo", run_id, {}, "rlhf-stage/gpu")
    assert cancelled == ["f1"]


# ---- the torchrun watcher ----------------------------------------------------------------

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
        remote.watch(_script(tmp_path, "echo hello; exit 3"), dict(os.environ), "sft", tmp_path)
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_cancellation_while_streaming_kills_the_group(tmp_path, monkeypatch):
    def cancelled(*args, **kwargs):
        raise KeyboardInterrupt  # what arrives in the task when its run is cancelled

    monkeypatch.setattr(remote, "print", cancelled, raising=False)
    with pytest.raises(KeyboardInterrupt):
        remote.watch(_script(tmp_path, "echo started; wait"), dict(os.environ), "sft",
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
        remote.watch(cmd, dict(os.environ), "sft", tmp_path)
    (tmp_path / "error_rank1.json").unlink()
    with pytest.raises(RuntimeError, match="sft rank 0: DistBackendError: connection closed"):
        remote.watch(cmd, dict(os.environ), "sft", tmp_path)


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
        remote.watch([sys.executable, "-c", "raise SystemExit(1)"], dict(os.environ), "sft",
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

    monkeypatch.setattr(remote, "watch", fake_watch)
    before, threads = dict(os.environ), torch.get_num_threads()
    ctx = RunContext(tracking_uri="sqlite:///x.db", experiment_id="0", parent_run_id="p",
                     workdir=str(tmp_path), seed=0)
    cfg = PipelineConfig.model_validate({"model": {"nproc": 2}})
    assert remote.run_ranks(ctx, cfg, "sft", "r", {}) == {}
    assert seen["env"]["OMP_NUM_THREADS"] == "1" and "--nproc-per-node=2" in seen["cmd"]
    assert dict(os.environ) == before and torch.get_num_threads() == threads
