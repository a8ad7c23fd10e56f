"""reward_model: a scalar-head reward model trained on the preference pairs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from rlhf_core.config import RewardConfig
from rlhf_core.models.adapters import save_scalar_adapter
from rlhf_core.models.loader import adapt_scalar, load_pretrained, load_tokenizer
from rlhf_core.models.precision import autocast
from rlhf_core.models.scoring import score_texts
from rlhf_core.train.loop import total_steps
from rlhf_core.train.reward import (
    PairExamples,
    evaluate_reward_model,
    pair_margins,
    train_reward_model,
)
from tasks.pipeline.judge import resolve_judge
from tasks.pipeline.prepare import Prepared
from tasks.pipeline.stages.context import Stage, StageContext
from tasks.pipeline.stages.records import DataRecord, ModelRecord
from tasks.pipeline.stages.run import stage_task
from tasks.pipeline.stages.token_data import preference_pairs
from tasks.platform.files import read_jsonl


def gold_accuracy(model, tokenizer, held_rows: Callable[[], list[dict]], judge_name: str,
                  device) -> float | None:
    """RM accuracy against the gold judge's ordering, ties skipped (None: no judge)."""
    judge = resolve_judge(judge_name)
    rows = held_rows() if judge is not None else []
    if judge is None or not rows:
        return None
    chosen = score_texts(model, tokenizer, [r["prompt"] for r in rows],
                         [r["chosen"] for r in rows], device)
    rejected = score_texts(model, tokenizer, [r["prompt"] for r in rows],
                           [r["rejected"] for r in rows], device)
    hits, n = 0, 0
    for i, r in enumerate(rows):
        a, b = judge(r["prompt"], r["chosen"], True), judge(r["prompt"], r["rejected"], True)
        if a == b:
            continue
        n += 1
        hits += int((chosen[i] > rejected[i]) == (a > b))
    return hits / n if n else None


@dataclass(frozen=True)
class PreferenceSplit:
    """Training pairs (and margins), held-out pairs, and a reader of the held-out texts."""

    train: PairExamples
    held_out: PairExamples
    margins: torch.Tensor | None
    held_rows: Callable[[], list[dict]]


def preference_split(data_dir: Path, tokenizer, cfg: RewardConfig) -> PreferenceSplit:
    """Hold out ``preference_eval.jsonl`` if present, else the first ``reward.eval_fraction``
    of ``preference.jsonl``; texts are read only for margins and the judge."""
    path, eval_path = data_dir / "preference.jsonl", data_dir / "preference_eval.jsonl"
    pairs = preference_pairs(path, tokenizer)
    if eval_path.exists():
        train_from, held_out = 0, preference_pairs(eval_path, tokenizer)
        held_rows = partial(read_jsonl, eval_path)
    else:
        train_from = max(1, int(len(pairs) * cfg.eval_fraction))
        pairs, held_out = pairs[train_from:], pairs[:train_from]
        held_rows = partial(_head, path, train_from)
    margins = pair_margins(read_jsonl(path)[train_from:], True) if cfg.use_margin else None
    return PreferenceSplit(pairs, held_out, margins, held_rows)


def _head(path: Path, n: int) -> list[dict]:
    return read_jsonl(path)[:n]


def body(sc: StageContext, prep: Prepared, data: DataRecord, start: ModelRecord,
         init_dir: str | None = None) -> ModelRecord | None:
    """Train from ``start``'s trunk with a fresh head, or from a retrain's ``init_dir``
    (a reward model warm-starts; a causal LM gets a fresh head)."""
    cfg, device, spec = sc.cfg, sc.device, sc.spec
    generator = sc.seeded()
    tokenizer = load_tokenizer(sc.local(data.tokenizer, "validate's tokenizer"), spec)
    init = init_dir or sc.local(start.model, "sft's model")
    model = load_pretrained(init, spec, "scalar") if (Path(init) / "scalar_head.json").exists() \
        else load_pretrained(init, spec, "new_head")
    if spec.lora is not None:  # adapters on the trunk, the head in full
        model = adapt_scalar(model, spec.lora)
    split = preference_split(sc.local(data.data, "validate's data"), tokenizer, cfg.reward)
    pairs, held_out = split.train, split.held_out
    ck = sc.checkpointer({"model": model}, cfg.reward.checkpoint_every)
    live = sc.live(total_steps(len(pairs), cfg.reward.batch_size, cfg.reward.epochs))
    train_reward_model(model, pairs, split.margins, tokenizer.pad_token_id, cfg.reward, device,
                       generator, on_log=live, progress=sc.progress, checkpointer=ck,
                       precision=spec.precision, dp=sc.dp)
    if not sc.is_main:
        return None
    sc.say(f"scoring {len(held_out)} held-out pairs")
    with autocast(spec.precision, device):  # the precision every later stage scores in
        metrics = evaluate_reward_model(model, held_out, tokenizer.pad_token_id, device)
        if prep.judge != "none":
            sc.say("their accuracy against the gold judge's order")
        gold = gold_accuracy(model, tokenizer, split.held_rows, prep.judge, device)
    # against the held-out labels always; against the gold judge where one exists
    first = {"eval/rm_accuracy": metrics["eval/accuracy"]}
    if gold is not None:
        first["eval/rm_gold_accuracy"] = gold
    metrics.update(first)
    sc.log(0, metrics)
    sc.log_parent(first)
    sc.say("saving the model" + (" (its LoRA adapter and head)" if spec.lora else ""))
    out_dir = save_scalar(model, sc.dir / "model", init, spec)
    sc.log_artifacts(out_dir, "checkpoint")
    return ModelRecord(model=sc.publish(out_dir, "checkpoint", logged=True),
                       metrics={**first, **metrics})


def save_scalar(model, target: Path, init: str | Path, spec) -> Path:
    """Save a scalar model whole, or with LoRA its adapter and head over ``init``."""
    if spec.lora is None:
        return model.save(target)
    return save_scalar_adapter(model, target, init)


# what train_reward_model logs every log_every steps (the judge model's too)
TRAIN_METRICS = ("train/loss", "train/grad_norm", "train/lr", "train/accuracy", "train/margin",
                 "train/chosen_reward", "train/rejected_reward")
STAGE = Stage("reward_model", body, ModelRecord, sections=("reward", "model"), seed_offset=1,
              ranks=True,
              metrics=(*TRAIN_METRICS, "eval/loss", "eval/accuracy", "eval/margin",
                       "eval/chosen_reward", "eval/rejected_reward", "eval/rm_accuracy",
                       "eval/rm_gold_accuracy"),
              artifacts=("checkpoint",))
reward_model = stage_task(STAGE)
