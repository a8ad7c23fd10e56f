"""judge_model (a retrain's stage): the gate's judge reward model, trained on the pairs the
judge split (``judge_split``, a task before the reward model) held out, so it shares no
training pair with the reward model the challenger was optimised against."""

from __future__ import annotations

import shutil

from prefect import task

from rlhf_core.eval.gate import held_out_for_judge, pair_key
from rlhf_core.models.checkpoint import save_scalar_model
from rlhf_core.models.loader import load_tokenizer, new_scalar_model
from rlhf_core.train.reward import train_reward_model
from tasks.common import read_jsonl
from tasks.config import PipelineConfig
from tasks.stages.context import Stage, StageContext
from tasks.stages.records import DataRecord, ModelRecord
from tasks.stages.reward_model import TRAIN_METRICS
from tasks.stages.run import stage_task
from tasks.tracking.artifacts import Artifact, local_copy
from tasks.tracking.parent_run import log_parent_folder
from tasks.tracking.runs import RunContext, tag_parent
from tasks.tracking.tags import (
    JUDGE_SPLIT_BATCH_PAIRS_HELD_TAG,
    JUDGE_SPLIT_JUDGE_PAIRS_TAG,
    JUDGE_SPLIT_RM_PAIRS_TAG,
)


def _write_jsonl(path, rows: list[dict]) -> None:
    import json

    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _split_rows(rows: list[dict], fraction: float) -> tuple[list[dict], list[dict]]:
    held = [held_out_for_judge(r, fraction) for r in rows]
    return [r for r, h in zip(rows, held) if not h], [r for r, h in zip(rows, held) if h]


@task(name="judge_split")
def judge_split(ctx: RunContext, cfg: PipelineConfig, data: DataRecord,
                batch_keys: list[str] | None = None) -> DataRecord:
    """The validated data with the judge's held-out pairs taken out of ``preference.jsonl``
    (they go to ``judge_preference.jsonl`` beside it) -> the validate output for the reward
    model, with ``judge_rows`` added. Logged on the parent run (``judge_split/data``).
    ``retrain.gate.judge_data: configured``: held-out pairs among ``batch_keys`` (the
    batches') are kept from the reward model but do not train the judge either."""
    source = local_copy(ctx, data.data, "validate's data")
    target = ctx.stage_dir("judge_split") / "data"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
    train, held = _split_rows(read_jsonl(source / "preference.jsonl"),
                              cfg.retrain.gate.judge_fraction)
    n_held = len(held)
    if cfg.retrain.gate.judge_data == "configured" and batch_keys:
        from_batches = set(batch_keys)
        held = [r for r in held if pair_key(r) not in from_batches]
    if not train or not held:
        raise ValueError(f"judge split: {len(train)} pairs for the reward model and "
                         f"{len(held)} for the judge; both need some "
                         "(retrain.gate.judge_fraction)")
    _write_jsonl(target / "preference.jsonl", train)
    _write_jsonl(target / "judge_preference.jsonl", held)
    log_parent_folder(ctx, target, "judge_split/data")
    tag_parent(ctx, {JUDGE_SPLIT_RM_PAIRS_TAG: str(len(train)),
                     JUDGE_SPLIT_JUDGE_PAIRS_TAG: str(len(held)),
                     JUDGE_SPLIT_BATCH_PAIRS_HELD_TAG: str(n_held - len(held))})
    uri = f"runs:/{ctx.parent_run_id}/judge_split/data"
    return data.model_copy(update={"data": Artifact(path=str(target), uri=uri),
                                   "judge_rows": str(target / "judge_preference.jsonl")})


def body(sc: StageContext, data: DataRecord, init_dir: str) -> ModelRecord:
    """A fresh head on ``init_dir`` (the SFT policy), trained on ``judge_preference.jsonl``."""
    cfg, device, spec = sc.cfg, sc.device, sc.spec
    generator = sc.seeded()
    tokenizer = load_tokenizer(sc.local(data.tokenizer, "validate's tokenizer"), spec)
    rows = read_jsonl(sc.local(data.data, "the judge split") / "judge_preference.jsonl")
    model = new_scalar_model(init_dir, spec)
    epochs = cfg.retrain.gate.judge_epochs or cfg.reward.epochs
    reward = cfg.reward.model_copy(update={"epochs": epochs})
    train_reward_model(model, tokenizer, rows, reward, device, generator, on_log=sc.log,
                       progress=False, precision=spec.precision)
    out_dir = save_scalar_model(model, sc.dir / "model")
    return ModelRecord(model=sc.publish(out_dir, "checkpoint"),
                       metrics={"judge/pairs": float(len(rows))})


STAGE = Stage("judge_model", body, ModelRecord, seed_offset=7, metrics=TRAIN_METRICS,
              artifacts=("checkpoint",))

judge_model = stage_task(STAGE)
