"""Helpers shared by the stage tasks: the skip-or-run wrapper, JSONL I/O, model loading."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from prefect.artifacts import create_markdown_artifact
from prefect.context import get_run_context
from transformers.utils import logging as hf_logging

from rlhf_core.checkpoint import Checkpointer
from rlhf_core.config import ModelConfig
from rlhf_core.faults import crash_point, pause_point
from rlhf_core.loader import LoadSpec
from rlhf_core.models import resolve_device
from tasks.spool import resend_left, spool_for
from tasks.tracking import (
    RunContext,
    StepLogger,
    completed_output,
    record_output,
    run_url,
    stage_run,
)

hf_logging.disable_progress_bar()  # per-file load/save bars drown the stage progress bars


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_json(path: str | Path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_json(path: str | Path, obj) -> Path:
    """Write JSON atomically (temp file + rename)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
    tmp.replace(path)
    return path


def setup_torch(model_cfg: ModelConfig) -> torch.device:
    if model_cfg.torch_threads:
        torch.set_num_threads(model_cfg.torch_threads)
    return resolve_device(model_cfg.device)


def setup_models(model_cfg: ModelConfig) -> tuple[torch.device, LoadSpec]:
    """The device and the one load spec (dtype, precision, attention, trust_remote_code,
    gradient checkpointing, LoRA) that every model and tokenizer load of a stage uses."""
    device = setup_torch(model_cfg)
    return device, LoadSpec.from_config(model_cfg, device)


def in_prefect_run() -> bool:
    try:
        get_run_context()
        return True
    except Exception:  # noqa: BLE001 - prefect raises different errors outside a run
        return False


def stage_markdown(ctx: RunContext, stage: str, run_id: str, figures: dict) -> None:
    """A Prefect markdown artifact with the stage's key figures and its MLflow link."""
    if not in_prefect_run():
        return
    rows = "\n".join(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
                     for k, v in figures.items())
    md = f"## {stage}\n\nMLflow: {run_url(ctx, run_id)}\n\n| figure | value |\n|---|---|\n{rows}\n"
    create_markdown_artifact(key=f"rlhf-{stage.replace('_', '-')}", markdown=md,
                             description=f"{stage} summary")


def run_stage(ctx: RunContext, stage: str, body: Callable[[str], dict],
              params: dict | None = None) -> dict:
    """Skip ``stage`` when a finished child run recorded its output; else run ``body(run_id)``
    inside the child run, record its output reference and wall time, and return it. The
    Prefect summary shows its ``metrics`` and any non-metric ``figures`` (names, versions)."""
    pause_point(f"before:{stage}")
    done = completed_output(ctx, stage)
    if done is not None:
        done["skipped"] = True
        return done
    start = time.perf_counter()
    resend_left(ctx.client(), ctx.workdir)  # a resume sends what a tracking outage left
    with stage_run(ctx, stage, params) as run_id:
        out = body(run_id)
        out["run_id"], out["stage"] = run_id, stage
        out["wall_s"] = round(time.perf_counter() - start, 2)
        metric_logger(ctx, run_id)(0, {"time/stage_s": out["wall_s"]})
        record_output(ctx, run_id, out)
    crash_point(f"after:{stage}")
    figures = {"wall_s": out["wall_s"], **out.get("metrics", {}), **out.get("figures", {})}
    stage_markdown(ctx, stage, run_id, figures)
    return out


def stage_params(cfg, *sections: str) -> dict:
    """The settings of a stage's config sections, flattened (``ppo.kl_coef``...) for its run."""
    from tasks.config import flatten

    return flatten({name: getattr(cfg, name).model_dump(mode="json") for name in sections})


def metric_logger(ctx: RunContext, run_id: str) -> StepLogger:
    """on_log(step, metrics) for a stage's run; steps already logged (a resumed stage) are
    skipped, so no metric step is logged twice; writes the server does not take wait in the
    run's spool (tasks/spool.py)."""
    client = ctx.client()
    return StepLogger(client, run_id, spool_for(client, run_id, ctx.workdir))


def stop_on_outage(ctx: RunContext, run_id: str, ck: Checkpointer) -> Checkpointer:
    """Each checkpoint ``ck`` saves is where the stage stops once the tracking server has
    been away longer than ``ctx.outage_limit_s``."""
    spool = spool_for(ctx.client(), run_id, ctx.workdir)

    def on_saved(step: int, path: Path) -> None:
        spool.kept = (f"run {ctx.parent_run_id} keeps its finished stages, the checkpoint "
                      f"of {ck.label} step {step} in {path}")
        spool.check(ctx.outage_limit_s)

    ck.on_saved = on_saved
    return ck


def checkpoint_dir(ctx: RunContext, stage: str) -> Path:
    """Where a stage's mid-stage training-state checkpoints go: <workdir>/<stage>/checkpoints."""
    return ctx.stage_dir(stage) / "checkpoints"


def checkpointer(ctx: RunContext, keep: int, stage: str, models: dict, every: int):
    """Mid-stage training-state checkpoints in :func:`checkpoint_dir`."""
    return Checkpointer(checkpoint_dir(ctx, stage), models, every, keep, label=stage)
