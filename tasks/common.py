"""Helpers shared by the stage tasks: JSONL I/O, model set-up, metric logging, checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from prefect.artifacts import create_markdown_artifact
from prefect.context import get_run_context

from rlhf_core.config import ModelConfig
from tasks.tracking.runs import RunContext, StepLogger, run_url
from tasks.tracking.spool import spool_for

if TYPE_CHECKING:  # torch and the model code load with the first model, not this module
    import torch

    from rlhf_core.models.checkpoint import Checkpointer
    from rlhf_core.models.loader import LoadSpec


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
    """The thread count set, the device resolved (the model code is imported here, not with
    this module: a process that loads no model, e.g. a label import, never pays for it)."""
    import torch

    from rlhf_core.models.models import resolve_device

    if model_cfg.torch_threads:
        torch.set_num_threads(model_cfg.torch_threads)
    return resolve_device(model_cfg.device)


def setup_models(model_cfg: ModelConfig) -> tuple[torch.device, LoadSpec]:
    """The device and the one load spec (dtype, precision, attention, trust_remote_code,
    gradient checkpointing, LoRA) that every model and tokenizer load of a stage uses."""
    from rlhf_core.models.loader import LoadSpec

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


def stage_params(cfg, *sections: str) -> dict:
    """The settings of a stage's config sections, flattened (``ppo.kl_coef``...) for its run."""
    from tasks.config import flatten
    from tasks.redact import redacted

    return flatten(redacted({name: getattr(cfg, name).model_dump(mode="json")
                             for name in sections}))


def metric_logger(ctx: RunContext, run_id: str) -> StepLogger:
    """on_log(step, metrics) for a stage's run; steps already logged (a resumed stage) are
    skipped, so no metric step is logged twice; writes the server does not take wait in the
    run's spool (tasks/tracking/spool.py)."""
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
    from rlhf_core.models.checkpoint import Checkpointer

    return Checkpointer(checkpoint_dir(ctx, stage), models, every, keep, label=stage)
