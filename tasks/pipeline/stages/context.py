"""What a stage body ``body(sc, **inputs) -> record`` is given: :class:`Stage` (its table
entry) and :class:`StageContext`, through which it reaches everything, so the same body runs in
the task's process, on torchrun ranks or on a worker."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd
import torch

from rlhf_core.models.checkpoint import Checkpointer
from rlhf_core.models.loader import LoadSpec
from rlhf_core.parallel.distributed import DataParallel
from rlhf_core.train.optim import seed_everything
from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.prepare import setup_models
from tasks.pipeline.stages.progress import StageProgress
from tasks.pipeline.stages.records import Artifact, StageRecord
from tasks.platform.mlflow.artifacts import (
    local_copy,
    log_artifact,
    log_artifacts,
    log_datasets,
    log_table,
    log_text,
    publish_path,
)
from tasks.platform.mlflow.runs import RunContext, StepLogger, run_tags, set_tags
from tasks.platform.mlflow.spool import spool_for, spool_table, spool_tags

BIG_UPLOAD = 10 * 2**20  # bytes: an artifact upload from this size on is announced


def metric_logger(ctx: RunContext, run_id: str) -> StepLogger:
    """on_log(step, metrics) for a stage's run: skips steps already logged (a resumed stage);
    writes the server does not take wait in the run's spool."""
    client = ctx.client()
    return StepLogger(client, run_id, spool_for(client, run_id, ctx.workdir))


def checkpoint_dir(ctx: RunContext, stage: str) -> Path:
    """<workdir>/<stage>/checkpoints: a stage's mid-stage training-state checkpoints."""
    return ctx.stage_dir(stage) / "checkpoints"


def state_bytes(*modules, optimizer=None) -> int:
    """Bytes of every parameter and buffer of ``modules`` plus the optimizer's tensors."""
    total = sum(t.numel() * t.element_size() for m in modules if m is not None
                for t in list(m.parameters()) + list(m.buffers()))
    if optimizer is not None:
        total += sum(v.numel() * v.element_size() for state in optimizer.state.values()
                     for v in state.values() if isinstance(v, torch.Tensor))
    return total


@contextmanager
def peak_memory(interval_s: float = 0.2):
    """A dict filled on exit with ``memory/peak_rss_gb`` and, on CUDA, ``memory/peak_gpu_gb``."""
    import psutil

    proc, out, stop = psutil.Process(), {}, threading.Event()
    peak = [proc.memory_info().rss]

    def sample() -> None:
        while not stop.wait(interval_s):
            peak[0] = max(peak[0], proc.memory_info().rss)

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    thread = threading.Thread(target=sample, daemon=True, name="peak-rss")
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()
        peak[0] = max(peak[0], proc.memory_info().rss)
        out["memory/peak_rss_gb"] = peak[0] / 2**30
        if cuda:
            out["memory/peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 2**30


@dataclass(frozen=True)
class Stage:
    """One pipeline stage in one entry; its Prefect task is derived from it (``stage_task``).
    ``seed_offset`` None: draws no random numbers. ``metrics``/``artifacts``: what the body
    logs, as ``fnmatch`` patterns where a part varies (``samples/iter_*.json``)."""

    name: str
    body: Callable[..., StageRecord | None]
    record: type[StageRecord]
    sections: tuple[str, ...] = ()
    seed_offset: int | None = None
    ranks: bool = False
    metrics: tuple[str, ...] = ()
    artifacts: tuple[str, ...] = ()

    @property
    def inputs(self) -> tuple[inspect.Parameter, ...]:
        """The body's parameters after ``sc``."""
        return tuple(inspect.signature(self.body).parameters.values())[1:]


class StageContext:
    """One run of one stage: run context, config, MLflow child run and, on ranks, the DP group."""

    def __init__(self, run: RunContext, cfg: PipelineConfig, stage: Stage, run_id: str,
                 dp: DataParallel | None = None):
        self.run, self.cfg, self.stage, self.run_id, self.dp = run, cfg, stage, run_id, dp

    # ---- where and how models load -------------------------------------------------------
    @cached_property
    def _models(self) -> tuple[torch.device, LoadSpec]:
        return setup_models(self.cfg.model)  # sets the thread count first

    @property
    def device(self) -> torch.device:
        return self.dp.device if self.dp is not None else self._models[0]

    @property
    def spec(self) -> LoadSpec:
        """The one load spec (dtype, precision, attention, LoRA...) of every load."""
        return self._models[1]

    @property
    def seed(self) -> int:
        if self.stage.seed_offset is None:
            raise ValueError(f"stage {self.stage.name} has no seed offset in the table")
        return self.run.seed + self.stage.seed_offset

    def seeded(self) -> torch.Generator:
        """Seed python, numpy and torch -> the stage's data-order generator."""
        return seed_everything(self.seed)

    @property
    def is_main(self) -> bool:  # this process saves, logs and returns the record
        return self.dp is None or self.dp.is_main

    @property
    def progress(self) -> bool:  # a progress bar: the task's own process only
        return self.run.progress and self.dp is None

    # ---- files ------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:  # <workdir>/<stage>: where the stage writes
        return self.run.stage_dir(self.stage.name)

    def local(self, artifact: Artifact, what: str) -> Path:
        """An input's local path, downloaded from MLflow once if this machine lacks it."""
        return local_copy(self.run, artifact, what)

    def say(self, message: str) -> None:
        """One line of what the stage is doing now, so no minute between progress bars is silent."""
        print(f"{self.stage.name}: {message}", flush=True)

    def _announced(self, path: Path, artifact_path: str) -> Callable[[], None]:
        """Say a large upload is starting -> a callable that says when it ended."""
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) \
            if path.is_dir() else path.stat().st_size if path.exists() else 0
        if size < BIG_UPLOAD:
            return lambda: None
        start = time.perf_counter()
        self.say(f"logging {artifact_path} to MLflow ({size / 2**20:.0f} MB)")
        return lambda: self.say(f"logged {artifact_path} in {time.perf_counter() - start:.0f} s")

    def publish(self, path: str | Path, artifact_path: str, logged: bool = False) -> Artifact:
        """Log ``path`` (unless ``logged``) as ``artifact_path`` -> the typed output field."""
        done = (lambda: None) if logged else self._announced(Path(path), artifact_path)
        out = publish_path(self.run, self.run_id, Path(path), artifact_path, logged)
        done()
        return out

    def log_artifacts(self, folder: str | Path, artifact_path: str) -> None:
        done = self._announced(Path(folder), artifact_path)
        log_artifacts(self.client, self.run_id, folder, artifact_path)
        done()

    def log_artifact(self, path: str | Path, folder: str) -> None:
        log_artifact(self.client, self.run_id, path, folder)

    def log_text(self, text: str, artifact_file: str) -> None:
        log_text(self.client, self.run_id, text, artifact_file)

    def log_table(self, rows: pd.DataFrame, artifact_file: str, spooled: bool = False,
                  parent: bool = False) -> None:
        """An MLflow table on the stage's (or ``parent``) run; ``spooled``: via the run's spool,
        so the training loop never waits on the server."""
        run_id = self.run.parent_run_id if parent else self.run_id
        if spooled:
            spool_table(spool_for(self.client, run_id, self.run.workdir), rows, artifact_file)
        else:
            log_table(self.client, run_id, rows, artifact_file)

    def log_datasets(self, files: dict[str, Path], context: str) -> dict[str, str]:
        """The data files as MLflow dataset inputs of the stage and parent runs -> digests."""
        return log_datasets(self.client, [self.run_id, self.run.parent_run_id], files, context)

    # ---- tracking ---------------------------------------------------------------------------
    @cached_property
    def client(self):
        return self.run.client()

    @cached_property
    def log(self) -> Callable[[int, dict[str, float]], None]:
        """``log(step, metrics)`` into the stage's run; on ranks only rank 0 logs (and prints)."""
        if self.dp is None:
            return metric_logger(self.run, self.run_id)
        if not self.dp.is_main:
            return lambda step, metrics: None
        log, name, world = metric_logger(self.run, self.run_id), self.stage.name, self.dp.world

        def on_log(step: int, metrics: dict[str, float]) -> None:
            log(step, metrics)
            shown = ", ".join(f"{k}={v:.4g}" for k, v in list(metrics.items())[:3])
            print(f"{name} step {step} ({world} ranks): {shown}", flush=True)

        return on_log

    def log_parent(self, metrics: dict[str, float]) -> None:
        metric_logger(self.run, self.run.parent_run_id)(0, metrics)

    def live(self, total: int) -> Callable[..., None]:
        """``log`` plus a Prefect progress artifact and log line over ``total`` steps."""
        return self.log if self.dp is not None else StageProgress(
            self.stage.name, total, self.log, bar=self.progress)

    def run_tags(self) -> dict[str, str]:  # a resumed stage's: from its first try on
        return run_tags(self.client, self.run_id)

    def set_tags(self, tags: dict[str, str], parent: bool = False, spooled: bool = False) -> None:
        """Tags on the stage's (or ``parent``) run; ``spooled``: via the spool, in order with
        the training loop's writes."""
        run_id = self.run.parent_run_id if parent else self.run_id
        if spooled:
            spool_tags(spool_for(self.client, run_id, self.run.workdir), tags)
        else:
            set_tags(self.client, run_id, tags)

    @property
    def checkpoint_dir(self) -> Path:
        return checkpoint_dir(self.run, self.stage.name)

    def checkpointer(self, models: dict, every: int) -> Checkpointer:
        return self.stop_on_outage(Checkpointer(
            self.checkpoint_dir, models, every, self.cfg.tracking.keep_checkpoints,
            label=self.stage.name))

    def stop_on_outage(self, ck: Checkpointer) -> Checkpointer:
        """Mid-stage checkpoints where the stage stops once the tracking server has been away
        longer than ``outage_limit_s``."""
        run, spool = self.run, spool_for(self.client, self.run_id, self.run.workdir)

        def on_saved(step: int, path: Path) -> None:
            spool.kept = (f"run {run.parent_run_id} keeps its finished stages, the checkpoint "
                          f"of {ck.label} step {step} in {path}")
            spool.check(run.outage_limit_s)

        ck.on_saved = on_saved
        return ck
