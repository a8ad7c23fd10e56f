"""judge_model: a judge reward model, an independent scorer trained only on pairs the reward
model never saw (a retrain's ``judge_split`` pairs, else the reward model's held-out ones), for
the gate and for PPO's held-out checks (``ppo.health.judge``)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow as pa
import torch
from prefect import task

from data_checks.tokens import read_tokens, tokens_path, write_tokens
from rlhf_core.eval.gate import held_out_for_judge, pair_key
from rlhf_core.models.loader import LoadSpec, adapt_scalar, load_pretrained, load_tokenizer
from rlhf_core.models.models import ScalarHeadModel
from rlhf_core.train.reward import pair_margins, train_reward_model
from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.stages.context import Stage, StageContext
from tasks.pipeline.stages.records import DataRecord, ModelRecord
from tasks.pipeline.stages.reward_model import TRAIN_METRICS, preference_split, save_scalar
from tasks.pipeline.stages.run import stage_task
from tasks.pipeline.stages.token_data import preference_pairs
from tasks.platform.files import read_jsonl
from tasks.platform.mlflow.artifacts import Artifact, local_copy, log_artifacts
from tasks.platform.mlflow.runs import RunContext, tag_parent
from tasks.platform.mlflow.tags import (
    JUDGE_SPLIT_BATCH_PAIRS_HELD_TAG,
    JUDGE_SPLIT_JUDGE_PAIRS_TAG,
    JUDGE_SPLIT_RM_PAIRS_TAG,
)


@task(name="judge_split")
def judge_split(ctx: RunContext, cfg: PipelineConfig, data: DataRecord,
                batch_keys: list[str] | None = None) -> DataRecord:
    """Move the judge's held-out pairs to ``judge_preference.jsonl``, so the reward model never
    trains on them (``judge_data: configured``: held-out batch pairs train neither model)."""
    source = local_copy(ctx, data.data, "validate's data")
    target = ctx.stage_dir("judge_split") / "data"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
    rows = read_jsonl(source / "preference.jsonl")
    judged = [held_out_for_judge(r, cfg.retrain.gate.judge_fraction) for r in rows]
    train = [i for i, h in enumerate(judged) if not h]  # the reward model's row numbers
    held = [i for i, h in enumerate(judged) if h]  # the judge's
    n_held = len(held)
    if cfg.retrain.gate.judge_data == "configured" and batch_keys:
        from_batches = set(batch_keys)
        held = [i for i in held if pair_key(rows[i]) not in from_batches]
    if not train or not held:
        raise ValueError(f"judge split: {len(train)} pairs for the reward model and "
                         f"{len(held)} for the judge; both need some "
                         "(retrain.gate.judge_fraction)")
    # the copied token file (if any) was the whole set's: each part gets its own rows' ids
    tokens = tokens_path(source / "preference.jsonl")
    table = read_tokens(tokens) if tokens.is_file() else None
    for name, part in (("preference", train), ("judge_preference", held)):
        path = target / f"{name}.jsonl"
        path.write_text("".join(json.dumps(rows[i], ensure_ascii=False) + "\n" for i in part),
                        encoding="utf-8")
        if table is not None:
            write_tokens(table.take(pa.array(part, type=pa.int64())), tokens_path(path))
    log_artifacts(ctx.client(), ctx.parent_run_id, target, "judge_split/data")
    tag_parent(ctx, {JUDGE_SPLIT_RM_PAIRS_TAG: str(len(train)),
                     JUDGE_SPLIT_JUDGE_PAIRS_TAG: str(len(held)),
                     JUDGE_SPLIT_BATCH_PAIRS_HELD_TAG: str(n_held - len(held))})
    uri = f"runs:/{ctx.parent_run_id}/judge_split/data"
    return data.model_copy(update={"data": Artifact(path=str(target), uri=uri),
                                   "judge_rows": str(target / "judge_preference.jsonl")})


def fit_judge(start_dir: Path, pairs, rows: Callable[[], list[dict]], pad_id: int,
              cfg: PipelineConfig, spec: LoadSpec, device: torch.device,
              generator: torch.Generator, on_log=None) -> ScalarHeadModel:
    """A fresh scalar head on ``start_dir``'s policy, trained like the reward model on the
    judge's ``pairs`` (``rows``: their texts, for margins)."""
    margins = pair_margins(rows(), True) if cfg.reward.use_margin else None
    model = load_pretrained(start_dir, spec, "new_head")
    if spec.lora is not None:
        model = adapt_scalar(model, spec.lora)
    epochs = cfg.retrain.gate.judge_epochs or cfg.reward.epochs
    reward = cfg.reward.model_copy(update={"epochs": epochs})
    train_reward_model(model, pairs, margins, pad_id, reward, device, generator,
                       on_log=on_log, progress=False, precision=spec.precision)
    return model


def body(sc: StageContext, data: DataRecord, start: ModelRecord) -> ModelRecord:
    """Train a judge on ``start``'s policy: the judge split's pairs, else the RM's held-out ones."""
    cfg, device, spec = sc.cfg, sc.device, sc.spec
    generator = sc.seeded()
    tokenizer = load_tokenizer(sc.local(data.tokenizer, "validate's tokenizer"), spec)
    folder = sc.local(data.data, "validate's data")
    if data.judge_rows is not None:
        path = folder / "judge_preference.jsonl"
        pairs = preference_pairs(path, tokenizer)  # the gate's ids, else encoded here
        rows = partial(read_jsonl, path)
    else:
        split = preference_split(folder, tokenizer, cfg.reward)
        pairs, rows = split.held_out, split.held_rows
    model = fit_judge(sc.local(start.model, "the policy the judge starts from"), pairs, rows,
                      tokenizer.pad_token_id, cfg, spec, device, generator, on_log=sc.log)
    out_dir = save_scalar(model, sc.dir / "model", sc.local(start.model, "the start policy"), spec)
    return ModelRecord(model=sc.publish(out_dir, "checkpoint"),
                       metrics={"judge/pairs": float(len(pairs))})


STAGE = Stage("judge_model", body, ModelRecord, seed_offset=7, metrics=TRAIN_METRICS,
              artifacts=("checkpoint",))
judge_model = stage_task(STAGE)
