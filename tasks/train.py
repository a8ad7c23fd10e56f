"""Stage tasks 2-5: SFT, reward model, reward normalisation, critic warm-start."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from rlhf_core.checkpoint import save_policy, save_scalar_model
from rlhf_core.distributed import DataParallel
from rlhf_core.loader import load_policy, load_scalar_model, load_tokenizer, new_scalar_model
from rlhf_core.loop import total_steps
from rlhf_core.models import resize_for_tokenizer
from rlhf_core.optim import seed_everything
from rlhf_core.reward import evaluate_reward_model, train_reward_model
from rlhf_core.scoring import normalise_scores, reward_norm_stats, score_texts
from rlhf_core.sft import sft_eval_loss, train_sft
from tasks.artifacts import local_path, publish
from tasks.common import (
    checkpointer,
    metric_logger,
    read_jsonl,
    run_stage,
    setup_models,
    stage_params,
    stop_on_outage,
    write_json,
)
from tasks.config import PipelineConfig
from tasks.judge import resolve_judge
from tasks.launch import rank_logger, stage_body
from tasks.progress import StageProgress
from tasks.tracking import RunContext


def _gold_accuracy(model, tokenizer, rows, judge_name: str, device) -> float | None:
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


def sft_stage(ctx: RunContext, cfg: PipelineConfig, prep: dict, data: dict, run_id: str,
              dp: DataParallel | None = None) -> dict | None:
    """The sft stage's work, in the task's process or on each torchrun rank (``dp``): only
    rank 0 logs, saves the model and returns the output reference."""
    device, spec = setup_models(cfg.model)
    device = dp.device if dp is not None else device
    generator = seed_everything(ctx.seed)
    tokenizer = load_tokenizer(local_path(ctx, data, "tokenizer"), spec)
    model = load_policy(prep["base_model"], spec)
    resize_for_tokenizer(model, tokenizer)
    rows = read_jsonl(local_path(ctx, data, "data_dir") / "sft.jsonl")
    log = rank_logger(ctx, run_id, "sft", dp)
    ck = stop_on_outage(ctx, run_id, checkpointer(
        ctx, cfg.tracking.keep_checkpoints, "sft", {"model": model}, cfg.sft.checkpoint_every))
    live = log if dp is not None else StageProgress(  # Prefect progress artifact + log line
        "sft", total_steps(len(rows), cfg.sft.batch_size, cfg.sft.epochs), log)
    last = train_sft(model, tokenizer, rows, cfg.sft, device, generator, live,
                     ctx.progress and dp is None, ck, precision=spec.precision, dp=dp)
    if dp is not None and not dp.is_main:
        return None
    out_dir = save_policy(model, tokenizer, ctx.stage_dir("sft") / "model")
    ctx.client().log_artifacts(run_id, str(out_dir), "checkpoint")
    metrics = {"sft/response_loss_train": sft_eval_loss(model, tokenizer, rows[:256], device)}
    log(0, metrics)
    return publish(ctx, run_id, {
        "model_dir": str(out_dir),
        "metrics": {"train/loss": last.get("train/loss", float("nan")), **metrics}},
        "model_dir", "checkpoint", logged=True)


@task(name="sft")
def sft(ctx: RunContext, cfg: PipelineConfig, prep: dict, data: dict) -> dict:
    """Fine-tune the base model on the demonstrations; save it as the SFT policy."""
    return run_stage(ctx, "sft", stage_body(ctx, cfg, "sft", sft_stage, prep=prep, data=data),
                     stage_params(cfg, "sft", "model"))


def reward_model_stage(ctx: RunContext, cfg: PipelineConfig, prep: dict, data: dict,
                       sft_out: dict, run_id: str, dp: DataParallel | None = None,
                       init_dir: str | None = None) -> dict | None:
    """The reward_model stage's work, in the task's process or on each torchrun rank.
    Initialised from the SFT checkpoint (a fresh head) or from ``init_dir`` (a retrain: the
    champion's reward model, warm start, or a causal LM, fresh head)."""
    device, spec = setup_models(cfg.model)
    device = dp.device if dp is not None else device
    generator = seed_everything(ctx.seed + 1)
    tokenizer = load_tokenizer(local_path(ctx, data, "tokenizer"), spec)
    init = init_dir or local_path(ctx, sft_out, "model_dir")
    model = load_scalar_model(init, spec) if (Path(init) / "scalar_head.json").exists() \
        else new_scalar_model(init, spec)
    data_dir = local_path(ctx, data, "data_dir")
    rows = read_jsonl(data_dir / "preference.jsonl")
    eval_path = data_dir / "preference_eval.jsonl"
    if eval_path.exists():
        held_out = read_jsonl(eval_path)
    else:
        n_eval = max(1, int(len(rows) * cfg.reward.eval_fraction))
        rows, held_out = rows[n_eval:], rows[:n_eval]
    log = rank_logger(ctx, run_id, "reward_model", dp)
    ck = stop_on_outage(ctx, run_id, checkpointer(ctx, cfg.tracking.keep_checkpoints,
                                                  "reward_model", {"model": model},
                                                  cfg.reward.checkpoint_every))
    live = log if dp is not None else StageProgress("reward_model", total_steps(
        len(rows), cfg.reward.batch_size, cfg.reward.epochs), log)
    train_reward_model(model, tokenizer, rows, cfg.reward, device, generator, live,
                       ctx.progress and dp is None, ck, precision=spec.precision, dp=dp)
    if dp is not None and not dp.is_main:
        return None
    metrics = evaluate_reward_model(model, tokenizer, held_out, device)
    # against the held-out labels always; against the gold judge where one exists
    first = {"eval/rm_accuracy": metrics["eval/accuracy"]}
    gold = _gold_accuracy(model, tokenizer, held_out, prep["judge"], device)
    if gold is not None:
        first["eval/rm_gold_accuracy"] = gold
    metrics.update(first)
    log(0, metrics)
    metric_logger(ctx, ctx.parent_run_id)(0, first)
    out_dir = save_scalar_model(model, ctx.stage_dir("reward_model") / "model")
    ctx.client().log_artifacts(run_id, str(out_dir), "checkpoint")
    return publish(ctx, run_id, {"model_dir": str(out_dir), "metrics": {**first, **metrics}},
                   "model_dir", "checkpoint", logged=True)


@task(name="reward_model")
def reward_model(ctx: RunContext, cfg: PipelineConfig, prep: dict, data: dict,
                 sft_out: dict, init_dir: str | None = None) -> dict:
    """Train a scalar-head RM on preference pairs, from the SFT checkpoint or ``init_dir``."""
    return run_stage(ctx, "reward_model", stage_body(ctx, cfg, "reward_model",
                                                     reward_model_stage, prep=prep, data=data,
                                                     sft_out=sft_out, init_dir=init_dir),
                     stage_params(cfg, "reward", "model"))


@task(name="reward_norm")
def reward_norm(ctx: RunContext, cfg: PipelineConfig, data: dict, rm_out: dict) -> dict:
    """Score the SFT set (prompt + reference response); store {mean, std, n} as an artifact."""

    def body(run_id: str) -> dict:
        device, spec = setup_models(cfg.model)
        tokenizer = load_tokenizer(local_path(ctx, data, "tokenizer"), spec)
        model = load_scalar_model(local_path(ctx, rm_out, "model_dir"), spec,
                                  trainable=False).to(device)
        rows = read_jsonl(local_path(ctx, data, "data_dir") / "sft.jsonl")
        rows = rows[: cfg.reward_norm.max_samples] if cfg.reward_norm.max_samples else rows
        scores = score_texts(model, tokenizer, [r["prompt"] for r in rows],
                             [r["response"] for r in rows], device, cfg.reward_norm.batch_size)
        stats = reward_norm_stats(scores)
        normalised = normalise_scores(scores, stats, cfg.reward_norm.divide_by_std)
        check = float(normalised.mean())
        if abs(check) > 1e-3 * max(1.0, stats["std"]):
            raise RuntimeError(f"reward normalisation check failed: mean after = {check}")
        path = write_json(ctx.stage_dir("reward_norm") / "reward_norm.json", stats)
        metrics = {"reward/mean": stats["mean"], "reward/std": stats["std"],
                   "reward/n": float(stats["n"]), "reward/normalised_mean": check}
        metric_logger(ctx, run_id)(0, metrics)
        return publish(ctx, run_id, {"stats_path": str(path), "stats": stats,
                                     "metrics": metrics}, "stats_path", "reward_norm.json")

    return run_stage(ctx, "reward_norm", body, stage_params(cfg, "reward_norm"))


@task(name="critic_init")
def critic_init(ctx: RunContext, cfg: PipelineConfig, rm_out: dict) -> dict:
    """The value model starts as a copy of the reward model, named explicitly; a critic-free
    estimator has none, and the stage's run says so."""

    def body(run_id: str) -> dict:
        if not cfg.ppo.uses_critic:
            reason = (f"no critic: ppo.advantage_estimator={cfg.ppo.advantage_estimator} "
                      "uses no value model")
            ctx.client().set_tag(run_id, "rlhf.critic_skipped", reason)
            return {"model_dir": None, "metrics": {}, "figures": {"critic": reason}}
        _, spec = setup_models(cfg.model)
        rm_dir = local_path(ctx, rm_out, "model_dir")
        model = load_scalar_model(rm_dir, spec)  # float32: an exact copy
        out_dir = save_scalar_model(model, ctx.stage_dir("critic_init") / "model")
        source = rm_out.get("model_uri") or str(rm_dir)
        ctx.client().set_tag(run_id, "rlhf.critic_source", source)
        n_params = sum(p.numel() for p in model.parameters())
        return publish(ctx, run_id, {"model_dir": str(out_dir), "source": source,
                                     "metrics": {"critic/num_params": float(n_params)}},
                       "model_dir", "checkpoint")

    return run_stage(ctx, "critic_init", body)
