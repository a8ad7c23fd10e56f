"""Stage tasks 2-5: SFT, reward model, reward normalisation, critic warm-start."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from rlhf_core.checkpoint import save_policy, save_scalar_model
from rlhf_core.loop import total_steps
from rlhf_core.models import ScalarHeadModel, load_causal_lm, load_tokenizer, resize_for_tokenizer
from rlhf_core.optim import seed_everything
from rlhf_core.reward import (
    evaluate_reward_model,
    normalise_scores,
    reward_norm_stats,
    score_texts,
    train_reward_model,
)
from rlhf_core.sft import sft_eval_loss, train_sft
from tasks.common import (
    checkpointer,
    metric_logger,
    read_jsonl,
    run_stage,
    setup_torch,
    write_json,
)
from tasks.config import PipelineConfig
from tasks.progress import StageProgress
from tasks.tracking import RunContext


def _gold_accuracy(model, tokenizer, rows, judge_name: str, device) -> float | None:
    """RM accuracy against the gold judge's ordering (demo data), ties skipped."""
    if judge_name != "demo" or not rows:
        return None
    from rlhf_core.demo import judge_score

    chosen = score_texts(model, tokenizer, [r["prompt"] for r in rows],
                         [r["chosen"] for r in rows], device)
    rejected = score_texts(model, tokenizer, [r["prompt"] for r in rows],
                           [r["rejected"] for r in rows], device)
    hits, n = 0, 0
    for i, r in enumerate(rows):
        a, b = judge_score(r["prompt"], r["chosen"]), judge_score(r["prompt"], r["rejected"])
        if a == b:
            continue
        n += 1
        hits += int((chosen[i] > rejected[i]) == (a > b))
    return hits / n if n else None


@task(name="sft")
def sft(ctx: RunContext, cfg: PipelineConfig, prep: dict, data: dict) -> dict:
    """Fine-tune the base model on the demonstrations; save it as the SFT policy."""

    def body(run_id: str) -> dict:
        device = setup_torch(cfg.model)
        generator = seed_everything(ctx.seed)
        tokenizer = load_tokenizer(data["tokenizer"])
        model = load_causal_lm(prep["base_model"], cfg.model.dtype, cfg.model.trust_remote_code)
        resize_for_tokenizer(model, tokenizer)
        rows = read_jsonl(Path(data["data_dir"]) / "sft.jsonl")
        log = metric_logger(ctx, run_id)
        ck = checkpointer(ctx, cfg.tracking.keep_checkpoints, "sft", {"model": model},
                          cfg.sft.checkpoint_every)
        live = StageProgress("sft", total_steps(len(rows), cfg.sft.batch_size, cfg.sft.epochs),
                             log)
        last = train_sft(model, tokenizer, rows, cfg.sft, device, generator, live,
                         ctx.progress, ck)
        out_dir = save_policy(model, tokenizer, ctx.stage_dir("sft") / "model")
        ctx.client().log_artifacts(run_id, str(out_dir), "checkpoint")
        metrics = {"sft/response_loss_train": sft_eval_loss(model, tokenizer, rows[:256], device)}
        log(0, metrics)
        return {"model_dir": str(out_dir),
                "metrics": {"train/loss": last.get("train/loss", float("nan")), **metrics}}

    return run_stage(ctx, "sft", body)


@task(name="reward_model")
def reward_model(ctx: RunContext, cfg: PipelineConfig, prep: dict, data: dict,
                 sft_out: dict, init_dir: str | None = None) -> dict:
    """Train a scalar-head RM on preference pairs, initialised from the SFT checkpoint (a
    fresh head) or from ``init_dir`` (a retrain: the champion's reward model, warm start,
    or a causal LM, fresh head)."""

    def body(run_id: str) -> dict:
        device = setup_torch(cfg.model)
        generator = seed_everything(ctx.seed + 1)
        tokenizer = load_tokenizer(data["tokenizer"])
        init = init_dir or sft_out["model_dir"]
        model = ScalarHeadModel.load(init, cfg.model.dtype) \
            if (Path(init) / "scalar_head.json").exists() \
            else ScalarHeadModel.from_causal_lm(init, cfg.model.dtype)
        rows = read_jsonl(Path(data["data_dir"]) / "preference.jsonl")
        eval_path = Path(data["data_dir"]) / "preference_eval.jsonl"
        if eval_path.exists():
            held_out = read_jsonl(eval_path)
        else:
            n_eval = max(1, int(len(rows) * cfg.reward.eval_fraction))
            rows, held_out = rows[n_eval:], rows[:n_eval]
        log = metric_logger(ctx, run_id)
        ck = checkpointer(ctx, cfg.tracking.keep_checkpoints, "reward_model", {"model": model},
                          cfg.reward.checkpoint_every)
        live = StageProgress("reward_model", total_steps(len(rows), cfg.reward.batch_size,
                                                         cfg.reward.epochs), log)
        train_reward_model(model, tokenizer, rows, cfg.reward, device, generator, live,
                           ctx.progress, ck)
        metrics = evaluate_reward_model(model, tokenizer, held_out, device)
        gold = _gold_accuracy(model, tokenizer, held_out, prep["judge"], device)
        metrics["eval/rm_accuracy"] = gold if gold is not None else metrics["eval/accuracy"]
        log(0, metrics)
        metric_logger(ctx, ctx.parent_run_id)(0, {"eval/rm_accuracy": metrics["eval/rm_accuracy"]})
        out_dir = save_scalar_model(model, ctx.stage_dir("reward_model") / "model")
        ctx.client().log_artifacts(run_id, str(out_dir), "checkpoint")
        first = {"eval/rm_accuracy": metrics["eval/rm_accuracy"]}
        return {"model_dir": str(out_dir), "metrics": {**first, **metrics}}

    return run_stage(ctx, "reward_model", body)


@task(name="reward_norm")
def reward_norm(ctx: RunContext, cfg: PipelineConfig, data: dict, rm_out: dict) -> dict:
    """Score the SFT set (prompt + reference response); store {mean, std, n} as an artifact."""

    def body(run_id: str) -> dict:
        device = setup_torch(cfg.model)
        tokenizer = load_tokenizer(data["tokenizer"])
        model = ScalarHeadModel.load(rm_out["model_dir"]).to(device)
        rows = read_jsonl(Path(data["data_dir"]) / "sft.jsonl")
        rows = rows[: cfg.reward_norm.max_samples] if cfg.reward_norm.max_samples else rows
        scores = score_texts(model, tokenizer, [r["prompt"] for r in rows],
                             [r["response"] for r in rows], device, cfg.reward_norm.batch_size)
        stats = reward_norm_stats(scores)
        normalised = normalise_scores(scores, stats, cfg.reward_norm.divide_by_std)
        check = float(normalised.mean())
        if abs(check) > 1e-3 * max(1.0, stats["std"]):
            raise RuntimeError(f"reward normalisation check failed: mean after = {check}")
        path = write_json(ctx.stage_dir("reward_norm") / "reward_norm.json", stats)
        ctx.client().log_artifact(run_id, str(path))
        metrics = {"reward/mean": stats["mean"], "reward/std": stats["std"],
                   "reward/n": float(stats["n"]), "reward/normalised_mean": check}
        metric_logger(ctx, run_id)(0, metrics)
        return {"stats_path": str(path), "stats": stats, "metrics": metrics}

    return run_stage(ctx, "reward_norm", body)


@task(name="critic_init")
def critic_init(ctx: RunContext, cfg: PipelineConfig, rm_out: dict) -> dict:
    """The value model starts as a copy of the reward model, named explicitly."""

    def body(run_id: str) -> dict:
        model = ScalarHeadModel.load(rm_out["model_dir"])
        out_dir = save_scalar_model(model, ctx.stage_dir("critic_init") / "model")
        ctx.client().set_tag(run_id, "rlhf.critic_source", rm_out["model_dir"])
        n_params = sum(p.numel() for p in model.parameters())
        return {"model_dir": str(out_dir), "source": rm_out["model_dir"],
                "metrics": {"critic/num_params": float(n_params)}}

    return run_stage(ctx, "critic_init", body)
