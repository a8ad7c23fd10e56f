"""Run a stage as ``model.nproc`` data-parallel ranks under ``torchrun``: rank 0 alone logs and
writes the output; on failure or cancellation the task kills the group, so no rank outlives it."""

from __future__ import annotations

import builtins
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import tasks
from tasks.config.pipeline_config import PipelineConfig
from tasks.platform.files import write_json
from tasks.platform.mlflow.runs import RunContext
from tasks.platform.prefect.remote import NodeGroup, RemoteStageError, stage_spec

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

