"""Stage task 6: PPO from the SFT policy, against the RM, with the warm-started critic."""

from __future__ import annotations

import json

import pandas as pd
from prefect import task

from rlhf_core.checkpoint import save_policy, save_scalar_model
from rlhf_core.data import encode
from rlhf_core.distributed import DataParallel
from rlhf_core.evaluate import mean_std, rm_judge_gap
from rlhf_core.loader import load_tokenizer
from rlhf_core.lora import merged, ppo_models
from rlhf_core.optim import seed_everything
from rlhf_core.ppo_dist import make_trainer
from tasks.artifacts import local_path, publish
from tasks.common import (
    checkpoint_dir,
    read_json,
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
from tasks.memory import peak_memory, state_bytes
from tasks.progress import StageProgress
from tasks.spool import spool_for, spool_table
from tasks.tracking import RunContext


def judge_monitor(judge_name: str):
    """Mean gold-judge score of each iteration's rollouts (logged as judge/score), demo only."""
    judge = resolve_judge(judge_name)
    if judge is None:
        return None

    def monitor(prompts: list[str], responses: list[str], has_eos: list[bool]) -> dict:
        scores = [judge(p, r, e) for p, r, e in zip(prompts, responses, has_eos)]
        return {"judge/score": sum(scores) / len(scores)}

    return monitor


def overoptimisation(judge_name: str, sft_rows: list[dict], norm_stats: dict):
    """metrics -> the RM-vs-judge gap of an iteration (``judge/rm_judge_gap_z``: the RM's and
    the judge's mean gains over the SFT demonstrations, in their standard deviations), and
    rows -> each sample row with its judge score; None without a judge."""
    judge = resolve_judge(judge_name)
    if judge is None:
        return None
    judge_base = mean_std([judge(r["prompt"], r["response"], True) for r in sft_rows])
    rm_base = (norm_stats["mean"], norm_stats["std"])

    def add(metrics: dict, rows: list[dict] | None) -> dict:
        for row in rows or []:
            row["judge_score"] = judge(row["prompt"], row["response"], row["has_eos"])
        gap = rm_judge_gap(metrics["objective/raw_scores"], metrics["judge/score"], rm_base,
                           judge_base)
        return {**metrics, **{f"judge/{k}": v for k, v in gap.items()}}

    return add


def ppo_stage(ctx: RunContext, cfg: PipelineConfig, prep: dict, data: dict, sft_out: dict,
              rm_out: dict, norm_out: dict, critic_out: dict, run_id: str,
              reference_dir: str | None = None, dp: DataParallel | None = None) -> dict | None:
    """The ppo stage's work, in the task's process or on each torchrun rank (``dp``): every
    rank rolls out its share of each batch; only rank 0 logs, writes samples, checkpoints and
    the final models, and returns the output reference."""
    device, spec = setup_models(cfg.model)
    device = dp.device if dp is not None else device
    generator = seed_everything(ctx.seed + 2)
    client = ctx.client()
    tokenizer = load_tokenizer(local_path(ctx, data, "tokenizer"), spec)
    # explicit critic source (none for a critic-free estimator); with model.lora:
    # adapters over the SFT and RM trunks (the reference is the start policy's weights)
    critic_dir = local_path(ctx, critic_out, "model_dir") if cfg.ppo.uses_critic else None
    start_dir = local_path(ctx, sft_out, "model_dir")  # here, or downloaded from MLflow
    policy, ref_policy, value_model, reward_model = ppo_models(
        start_dir, reference_dir or start_dir, critic_dir,
        local_path(ctx, rm_out, "model_dir"), spec)
    norm_stats = json.loads(local_path(ctx, norm_out, "stats_path").read_text())
    data_dir = local_path(ctx, data, "data_dir")
    prompts = [encode(tokenizer, r["prompt"]) for r in read_jsonl(data_dir / "prompts.jsonl")]
    sft_rows = read_jsonl(data_dir / "sft.jsonl")
    trainer = make_trainer(policy, ref_policy, value_model, reward_model, tokenizer, prompts,
                           cfg.ppo, norm_stats, device, generator,
                           divide_by_std=cfg.reward_norm.divide_by_std,
                           precision=spec.precision, dp=dp, seed=ctx.seed + 2)
    out_root = ctx.stage_dir("ppo")
    samples_path = out_root / "samples.json"  # survives a crash: rows up to the last save
    samples: list[dict] = read_json(samples_path) if samples_path.exists() else []
    metrics_log = rank_logger(ctx, run_id, "ppo", dp)
    # + progress artifact in the task's process; on ranks, rank 0's progress lines
    log = metrics_log if dp is not None else StageProgress("ppo", cfg.ppo.iterations,
                                                           metrics_log)
    judged = overoptimisation(prep["judge"], sft_rows, norm_stats)

    def on_iteration(iteration: int, metrics: dict, rows: list[dict] | None) -> None:
        metrics = judged(metrics, rows) if judged else metrics
        log(iteration, metrics)  # MLflow, progress artifact, log line
        if rows:
            samples[:] = [r for r in samples if r["iteration"] < iteration] + rows
            write_json(samples_path, samples)
            spool_table(spool, pd.DataFrame(rows), f"samples/iter_{iteration:05d}.json")

    spool = spool_for(client, run_id, ctx.workdir)  # the writes the server cannot take yet
    ck = stop_on_outage(ctx, run_id, trainer.checkpointer(checkpoint_dir(ctx, "ppo"),
                                                          cfg.tracking.keep_checkpoints))
    with peak_memory() as memory:  # under data parallelism: rank 0's
        last = trainer.train(on_iteration, progress=ctx.progress and dp is None,
                             monitor=judge_monitor(prep["judge"]), checkpointer=ck)
    if dp is not None and not dp.is_main:
        return None
    return _finish(ctx, run_id, trainer, tokenizer, samples, last, memory, metrics_log)


def _finish(ctx: RunContext, run_id: str, trainer, tokenizer, samples: list[dict],
            last: dict, memory: dict, metrics_log) -> dict:
    """Memory metrics, the final policy (and critic), the sample table -> the output."""
    client, out_root = ctx.client(), ctx.stage_dir("ppo")
    memory["memory/model_state_gb"] = state_bytes(
        trainer.policy, trainer.ref_policy, trainer.value_model, trainer.reward_model,
        optimizer=trainer.optimizer) / 2**30
    metrics_log(0, memory)  # not through the progress: it would read 0% again
    final_policy, final_value = merged(trainer.policy, trainer.value_model)
    policy_dir = save_policy(final_policy, tokenizer, out_root / "policy")
    value_dir = None if final_value is None else \
        str(save_scalar_model(final_value, out_root / "value_model"))
    spool_table(spool_for(client, run_id, ctx.workdir), pd.DataFrame(samples),
                "samples/all.json")
    keys = ("objective/scores", "objective/kl", "response/eos_rate", "response/length_mean")
    return publish(ctx, run_id, {"policy_dir": str(policy_dir), "value_dir": value_dir,
                                 "metrics": {**{k: last[k] for k in keys if k in last},
                                             **memory}}, "policy_dir", "checkpoint/policy")


@task(name="ppo")
def ppo(ctx: RunContext, cfg: PipelineConfig, prep: dict, data: dict, sft_out: dict,
        rm_out: dict, norm_out: dict, critic_out: dict, reference_dir: str | None = None) -> dict:
    """PPO iterations from the policy in ``sft_out`` (reference: the same policy, or
    ``reference_dir``); metrics per iteration (TRL names), sample tables, checkpoints; on
    ``model.nproc`` data-parallel ranks when it is above 1."""
    body = stage_body(ctx, cfg, "ppo", ppo_stage, prep=prep, data=data, sft_out=sft_out,
                      rm_out=rm_out, norm_out=norm_out, critic_out=critic_out,
                      reference_dir=reference_dir)
    return run_stage(ctx, "ppo", body, stage_params(cfg, "ppo", "model"))
