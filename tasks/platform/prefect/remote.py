"""A stage outside its task's process. On this machine, ``model.nproc`` data-parallel ranks
under ``torchrun``: rank 0 alone logs and writes the output; on failure or cancellation the task
kills the group, so no rank outlives it. On other machines, through Prefect deployments of
``rlhf-stage``: a routed stage (``routing.stages``) runs whole elsewhere, a multi-node stage's
extra nodes (``routing.nodes``) beside the head's; inputs and outputs travel as MLflow artifacts,
so only servers are shared."""

from __future__ import annotations

import builtins
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import tasks
from tasks.config.pipeline_config import PipelineConfig
from tasks.platform.files import write_json
from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.platform.mlflow.runs import RunContext, run_tags, set_tags
from tasks.platform.mlflow.tags import (
    NODES_TAG,
    ROUTED_FLOW_RUN_TAG,
    ROUTED_HOST_TAG,
    ROUTED_OUTPUT_TAG,
)
from tasks.platform.prefect.prefect_api import api_client
from tasks.platform.prefect.preflight import RoutingError

_log = logging.getLogger("rlhf.remote")

WORKDIR_ENV = "RLHF_STAGE_WORKDIR"
POLL_S = 1.0


class RemoteStageError(RuntimeError):
    """A routed stage or a node that failed, was cancelled, or that no worker started."""


def local_context(ctx: RunContext) -> RunContext:
    """The run context on a remote machine: files under ``$RLHF_STAGE_WORKDIR/<parent run
    id>`` when set, else the head's workdir path (a shared filesystem)."""
    root = os.environ.get(WORKDIR_ENV)
    if not root:
        return ctx
    return ctx.model_copy(update={"workdir": str(Path(root) / ctx.parent_run_id)})


def stage_spec(ctx: RunContext, cfg: PipelineConfig, stage: str, run_id: str, inputs: dict) -> dict:
    """What a machine needs to run ``stage`` into the child run ``run_id`` (JSON)."""
    return {"stage": stage, "run_id": run_id, "ctx": ctx.model_dump(mode="json"),
            "cfg": cfg.model_dump(mode="json"), "inputs": inputs}


def check_deployments(cfg: PipelineConfig) -> None:
    """Check, before any run opens, that every deployment the config routes to exists."""
    wanted = {f"routing.stages.{s}": d for s, d in cfg.routing.stages.items()}
    if cfg.model.nnodes > 1 and cfg.routing.nodes:
        wanted["routing.nodes"] = cfg.routing.nodes
    if not wanted:
        return
    store = default_tracking_uri(cfg.tracking.tracking_uri)
    if not store.startswith(("http://", "https://", "databricks")):
        warnings.warn(f"{', '.join(wanted)}: the other machines log into MLflow at {store}, "
                      "which they reach only through a filesystem they share with this one; "
                      "give every machine an MLflow server (MLFLOW_TRACKING_URI=http://<host>"
                      ":5000)", stacklevel=2)
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise RoutingError(f"{', '.join(wanted)}: stages on other machines need a Prefect "
                         "server every machine reaches (export PREFECT_API_URL=http://<host>:"
                         "4200/api here and on the workers)")
    with api_client() as client:
        for field, name in wanted.items():
            try:
                client.read_deployment_by_name(name)
            except ObjectNotFound:
                raise RoutingError(f"{field}={name}: no such deployment on the Prefect server "
                                 f"({PREFECT_API_URL.value()}); start `rlhf stage-worker "
                                 f"--name {name.split('/')[1]}` on the machine that should run "
                                 "it, or deploy it from prefect.yaml") from None


def _submit(deployment: str, parameters: dict, label: str):
    from prefect.deployments import run_deployment

    run = run_deployment(name=deployment, parameters=parameters, timeout=0)
    print(f"{label}: flow run {run.name} of {deployment} submitted; waiting for a worker",
          flush=True)
    return run


def _cancel(flow_run_id) -> None:
    from prefect.states import Cancelled, Cancelling

    try:
        with api_client() as client:
            state = client.read_flow_run(flow_run_id).state
            if state is None or state.is_final():
                return
            waiting = state.is_scheduled() or state.is_pending()
            client.set_flow_run_state(flow_run_id, Cancelled() if waiting else Cancelling(),
                                      force=True)
    except Exception as err:  # noqa: BLE001 - never hide the stage's own error behind this one
        _log.warning("could not cancel routed flow run %s (%s: %s); its worker may still run "
                     "it", flow_run_id, type(err).__name__, err)


class _Watched:
    """One submitted flow run: started yet? done? ended how? (one API read a poll)."""

    def __init__(self, run, deployment: str, label: str, start_timeout_s: float):
        self.run, self.deployment, self.label = run, deployment, label
        self.start_timeout_s, self.submitted = start_timeout_s, time.monotonic()
        self.started = self.done = False

    def problem(self, client) -> str | None:
        """Why the run can no longer do its part, or None; sets :attr:`done`."""
        state = client.read_flow_run(self.run.id).state
        if state is None:
            return None
        if state.is_running() or state.is_final():
            self.started = True
        if state.is_final() and not state.is_completed():
            return (f"{self.label}: flow run {self.run.name} of {self.deployment} ended "
                    f"{state.type.value}: {state.message or 'no message'}")
        self.done = state.is_completed()
        if not self.started and time.monotonic() - self.submitted > self.start_timeout_s:
            return (f"{self.label}: no worker started flow run {self.run.name} of "
                    f"{self.deployment} within routing.start_timeout_s={self.start_timeout_s:g}"
                    " s; is `rlhf stage-worker` (or a worker of the deployment's pool) running "
                    "on that machine?")
        return None


def _wait(problem: Callable[[], str | None], done: Callable[[], bool]) -> None:
    """Poll every POLL_S until ``done()``; a ``problem()`` raises :class:`RemoteStageError`."""
    while True:
        found = problem()
        if found:
            raise RemoteStageError(found)
        if done():
            return
        time.sleep(POLL_S)


def run_routed(ctx: RunContext, cfg: PipelineConfig, stage: str, run_id: str, inputs: dict,
               deployment: str) -> dict:
    """Run ``stage`` via ``deployment`` into run ``run_id`` -> the output record left on it."""
    label = f"stage {stage}"
    run = _submit(deployment, {"stage": stage, "spec": stage_spec(ctx, cfg, stage, run_id,
                                                                  inputs)}, label)
    set_tags(ctx.client(), run_id, {ROUTED_FLOW_RUN_TAG: f"{deployment} {run.name} ({run.id})"})
    watched = _Watched(run, deployment, label, cfg.routing.start_timeout_s)
    try:
        with api_client() as client:
            _wait(lambda: watched.problem(client), lambda: watched.done)
    except BaseException:
        _cancel(run.id)
        raise
    tags = run_tags(ctx.client(), run_id)
    if ROUTED_OUTPUT_TAG not in tags:
        raise RemoteStageError(f"{label}: flow run {run.name} of {deployment} completed but "
                               f"left no output record (tag {ROUTED_OUTPUT_TAG}) on run {run_id}")
    return json.loads(tags[ROUTED_OUTPUT_TAG])


def record_routed(ctx: RunContext, run_id: str, out: dict) -> None:
    """On the other machine: the output record and host name, for the head to read."""
    set_tags(ctx.client(), run_id, {ROUTED_OUTPUT_TAG: json.dumps(out, sort_keys=True),
                                    ROUTED_HOST_TAG: socket.gethostname()})


class NodeGroup:
    """Nodes 1..nnodes-1 of a multi-node stage as flow runs of ``routing.nodes`` (the head is
    node 0); leaving the block on an error cancels them."""

    def __init__(self, ctx: RunContext, cfg: PipelineConfig, stage: str, spec: dict):
        self.ctx, self.cfg, self.stage, self.spec = ctx, cfg, stage, spec
        self.addr = cfg.model.master_addr or socket.gethostname()
        self.port = cfg.model.master_port
        if not self.port:
            with socket.socket() as sock:  # a free port
                sock.bind(("", 0))
                self.port = sock.getsockname()[1]
        self.runs: list[_Watched] = []
        self._client = None
        self._lock = threading.Lock()

    def node(self, rank: int) -> dict:
        return {"rank": rank, "nnodes": self.cfg.model.nnodes, "addr": self.addr,
                "port": self.port, "timeout_s": int(self.cfg.routing.start_timeout_s) + 60}

    def __enter__(self) -> NodeGroup:
        deployment = self.cfg.routing.nodes
        try:
            for rank in range(1, self.cfg.model.nnodes):
                label = f"stage {self.stage} node {rank}"
                run = _submit(deployment, {"stage": self.stage, "spec": self.spec,
                                           "node": self.node(rank)}, label)
                self.runs.append(_Watched(run, deployment, label, self.cfg.routing.start_timeout_s))
        except BaseException:
            self._cancel_all()
            raise
        set_tags(self.ctx.client(), self.spec["run_id"], {NODES_TAG: json.dumps(
            {"nnodes": self.cfg.model.nnodes, "master": f"{self.addr}:{self.port}",
             "flow_runs": [w.run.name for w in self.runs]})})
        self._client = api_client().__enter__()
        return self

    def problem(self) -> str | None:
        """Why a node run can no longer do its part, or None."""
        with self._lock:
            for watched in self.runs:
                found = None if watched.done else watched.problem(self._client)
                if found:
                    return found
        return None

    def wait(self) -> None:
        """After node 0 finished: wait for every node run to complete."""
        _wait(self.problem, lambda: all(w.done for w in self.runs))

    def _cancel_all(self) -> None:
        for watched in self.runs:
            _cancel(watched.run.id)

    def __exit__(self, kind, err, tb) -> None:
        if kind is not None:
            self._cancel_all()
        if self._client is not None:
            self._client.__exit__(None, None, None)


# ---- torchrun ranks on this machine ---------------------------------------------------------

PROJECT_ROOT = Path(tasks.__file__).resolve().parents[1]  # what holds the packages


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """torchrun gets SIGTERM if the task's process dies (it then stops its ranks)."""
    with suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM torchrun's whole process group, SIGKILL what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, so an empty group reads as gone
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def launch_command(nproc: int, spec: Path, node: dict | None = None) -> list[str]:
    """torchrun here: a standalone group, or one node of a static rendezvous at ``addr:port``."""
    where = ["--standalone"] if node is None else [
        f"--nnodes={node['nnodes']}", f"--node-rank={node['rank']}",
        f"--master-addr={node['addr']}", f"--master-port={node['port']}",
        f"--rdzv-conf=timeout={node['timeout_s']}"]
    return [sys.executable, "-m", "torch.distributed.run", *where,
            f"--nproc-per-node={nproc}", "-m", "tasks.pipeline.stages.rank_main", str(spec)]


def rank_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(PROJECT_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        "PYTHONUNBUFFERED": "1",
        # torchrun's own default (with a banner): 1 thread per rank unless model.torch_threads
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def _write_spec(folder: Path, spec: dict) -> tuple[dict, Path]:
    """``spec`` told to leave rank 0's output and each rank's error in ``folder``, written
    there after an earlier launch's files are removed -> it and its file."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        old.unlink()
    spec = {**spec, "output": str(folder / "output.json"), "errors": str(folder)}
    return spec, write_json(folder / "spec.json", spec)


def run_ranks(ctx: RunContext, cfg: PipelineConfig, stage: str, run_id: str, inputs: dict) -> dict:
    """Run ``stage`` on ``cfg.model.nproc`` ranks per machine -> rank 0's output reference."""
    folder = ctx.stage_dir(stage) / "ranks"
    spec, path = _write_spec(folder, stage_spec(ctx, cfg, stage, run_id, inputs))
    if cfg.model.nnodes == 1:
        watch(launch_command(cfg.model.nproc, path), rank_env(), stage, folder)
    else:
        with NodeGroup(ctx, cfg, stage, spec) as nodes:
            watch(launch_command(cfg.model.nproc, path, nodes.node(0)), rank_env(), stage,
                  folder, problem=nodes.problem)
            nodes.wait()
    return json.loads((folder / "output.json").read_text())


def run_node(ctx: RunContext, spec: dict, node: dict) -> None:
    """Run a non-head node of a multi-node stage on this machine, watched like the head's."""
    cfg = PipelineConfig.model_validate(spec["cfg"])
    folder = ctx.stage_dir(spec["stage"]) / f"ranks_node{node['rank']}"
    _, path = _write_spec(folder, {**spec, "ctx": ctx.model_dump(mode="json")})
    watch(launch_command(cfg.model.nproc, path, node), rank_env(),
          f"{spec['stage']} node {node['rank']}", folder)


def watch(cmd: list[str], env: dict, stage: str, folder: Path,
          problem: Callable[[], str | None] | None = None) -> None:
    """Run ``cmd`` as its own process group and stream its lines; on failure or interruption
    kill the group and raise (the first rank error, as its own type when a builtin one, else
    the exit code and the last lines). A ``problem()`` (polled each second) also kills it."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, bufsize=1, start_new_session=True, preexec_fn=_die_with_parent)
    tail: deque = deque(maxlen=20)
    found: list[str] = []
    done = threading.Event()

    def poll() -> None:
        while not done.wait(1.0):
            try:
                reason = problem()
            except Exception as err:  # noqa: BLE001 - an API hiccup: try again next second
                print(f"could not read the other nodes' state: {err}", flush=True)
                continue
            if reason:
                found.append(reason)
                _kill_group(proc)
                return

    if problem is not None:
        threading.Thread(target=poll, daemon=True).start()
    try:
        for line in proc.stdout:
            tail.append(line.rstrip())
            print(f"[{stage}] {line.rstrip()}", flush=True)
        rc = proc.wait()
    except BaseException:  # cancelled, interrupted: no rank outlives its task
        _kill_group(proc)
        raise
    finally:
        done.set()
    if found:
        raise RemoteStageError(found[0])
    if rc != 0:
        _kill_group(proc)
        errors = sorted(folder.glob("error_rank*.json"), key=lambda p: p.stat().st_mtime)
        if not errors:
            lines = "\n".join(tail)
            raise RuntimeError(f"{stage}: torchrun exited with code {rc}; last output:\n{lines}")
        err = json.loads(errors[0].read_text())
        kind = getattr(builtins, err["type"], None)
        kind = kind if isinstance(kind, type) and issubclass(kind, Exception) else RuntimeError
        raise kind(f"{stage} rank {err['rank']}: {err['type']}: {err['message']}")

