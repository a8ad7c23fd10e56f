"""reward_model: a scalar-head reward model trained on the preference pairs."""

from __future__ import annotations

from pathlib import Path

from rlhf_core.models.checkpoint import save_scalar_model
from rlhf_core.models.loader import load_scalar_model, load_tokenizer, new_scalar_model
from rlhf_core.models.scoring import score_texts
from rlhf_core.train.loop import total_steps
from rlhf_core.train.reward import evaluate_reward_model, train_reward_model
from tasks.common import read_jsonl
from tasks.judge import resolve_judge
from tasks.prepare import Prepared
from tasks.stages.context import Stage, StageContext
from tasks.stages.records import DataRecord, ModelRecord
from tasks.stages.run import stage_task


def gold_accuracy(model, tokenizer, rows, judge_name: str, device) -> float | None:
    """RM accuracy against the gold judge's ordering (where a judge exists), ties skipped."""
    judge = resolve_judge(judge_name)
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


def body(sc: StageContext, prep: Prepared, data: DataRecord, start: ModelRecord,
         init_dir: str | None = None) -> ModelRecord | None:
    """In the task's process or on each torchrun rank. Initialised from ``start``'s trunk
    (the SFT policy; a fresh head) or from ``init_dir`` (a retrain: the champion's reward
    model, warm start, or a causal LM, fresh head)."""
    cfg, device, spec = sc.cfg, sc.device, sc.spec
    generator = sc.seeded()
    tokenizer = load_tokenizer(sc.local(data.tokenizer, "validate's tokenizer"), spec)
    init = init_dir or sc.local(start.model, "sft's model")
    model = load_scalar_model(init, spec) if (Path(init) / "scalar_head.json").exists() \
        else new_scalar_model(init, spec)
    data_dir = sc.local(data.data, "validate's data")
    rows = read_jsonl(data_dir / "preference.jsonl")
    eval_path = data_dir / "preference_eval.jsonl"
    if eval_path.exists():
        held_out = read_jsonl(eval_path)
    else:
        n_eval = max(1, int(len(rows) * cfg.reward.eval_fraction))
        rows, held_out = rows[n_eval:], rows[:n_eval]
    ck = sc.checkpointer({"model": model}, cfg.reward.checkpoint_every)
    live = sc.live(total_steps(len(rows), cfg.reward.batch_size, cfg.reward.epochs))
    train_reward_model(model, tokenizer, rows, cfg.reward, device, generator, on_log=live,
                       progress=sc.progress, checkpointer=ck, precision=spec.precision,
                       dp=sc.dp)
    if not sc.is_main:
        return None
    metrics = evaluate_reward_model(model, tokenizer, held_out, device)
    # against the held-out labels always; against the gold judge where one exists
    first = {"eval/rm_accuracy": metrics["eval/accuracy"]}
    gold = gold_accuracy(model, tokenizer, held_out, prep.judge, device)
    if gold is not None:
        first["eval/rm_gold_accuracy"] = gold
    metrics.update(first)
    sc.log(0, metrics)
    sc.log_parent(first)
    out_dir = save_scalar_model(model, sc.dir / "model")
    sc.log_artifacts(out_dir, "checkpoint")
    return ModelRecord(model=sc.publish(out_dir, "checkpoint", logged=True),
                       metrics={**first, **metrics})


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
