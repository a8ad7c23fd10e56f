"""Stage task 6: PPO from the SFT policy, against the RM, with the warm-started critic."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from prefect import task

from rlhf_core.checkpoint import save_policy, save_scalar_model
from rlhf_core.data import encode
from rlhf_core.models import ScalarHeadModel, load_causal_lm, load_tokenizer
from rlhf_core.optim import seed_everything
from rlhf_core.ppo import PPOTrainer
from tasks.common import metric_logger, read_json, read_jsonl, run_stage, setup_torch, write_json
from tasks.config import PipelineConfig
from tasks.progress import StageProgress
from tasks.tracking import RunContext


def judge_monitor(judge_name: str):
    """Mean gold-judge score of each iteration's rollouts (logged as judge/score), demo only."""
    if judge_name != "demo":
        return None
    from rlhf_core.demo import judge_score

    def monitor(prompts: list[str], responses: list[str], has_eos: list[bool]) -> dict:
        scores = [judge_score(p, r, e) for p, r, e in zip(prompts, responses, has_eos)]
        return {"judge/score": sum(scores) / len(scores)}

    return monitor


@task(name="ppo")
def ppo(ctx: RunContext, cfg: PipelineConfig, prep: dict, data: dict, sft_out: dict,
        rm_out: dict, norm_out: dict, critic_out: dict, reference_dir: str | None = None) -> dict:
    """PPO iterations from the policy in ``sft_out`` (reference: the same policy, or
    ``reference_dir``); metrics per iteration (TRL names), sample tables, checkpoints."""

    def body(run_id: str) -> dict:
        device = setup_torch(cfg.model)
        generator = seed_everything(ctx.seed + 2)
        client = ctx.client()
        tokenizer = load_tokenizer(data["tokenizer"])
        policy = load_causal_lm(sft_out["model_dir"], cfg.model.dtype)
        ref_policy = load_causal_lm(reference_dir or sft_out["model_dir"], cfg.model.dtype)
        value_model = ScalarHeadModel.load(critic_out["model_dir"])  # explicit critic source
        reward_model = ScalarHeadModel.load(rm_out["model_dir"])
        norm_stats = json.loads(Path(norm_out["stats_path"]).read_text())
        prompts = [encode(tokenizer, r["prompt"])
                   for r in read_jsonl(Path(data["data_dir"]) / "prompts.jsonl")]
        trainer = PPOTrainer(policy, ref_policy, value_model, reward_model, tokenizer, prompts,
                             cfg.ppo, norm_stats, device, generator,
                             divide_by_std=cfg.reward_norm.divide_by_std)
        out_root = ctx.stage_dir("ppo")
        samples_path = out_root / "samples.json"  # survives a crash: rows up to the last save
        samples: list[dict] = read_json(samples_path) if samples_path.exists() else []
        log = StageProgress("ppo", cfg.ppo.iterations, metric_logger(ctx, run_id))

        def on_iteration(iteration: int, metrics: dict, rows: list[dict] | None) -> None:
            log(iteration, metrics)  # MLflow, progress artifact, log line
            if rows:
                samples[:] = [r for r in samples if r["iteration"] < iteration] + rows
                write_json(samples_path, samples)
                client.log_table(run_id, data=pd.DataFrame(rows),
                                 artifact_file=f"samples/iter_{iteration:05d}.json")

        ck = trainer.checkpointer(out_root / "checkpoints", cfg.tracking.keep_checkpoints)
        last = trainer.train(on_iteration, progress=ctx.progress,
                             monitor=judge_monitor(prep["judge"]), checkpointer=ck)
        policy_dir = save_policy(trainer.policy, tokenizer, out_root / "policy")
        value_dir = save_scalar_model(trainer.value_model, out_root / "value_model")
        client.log_artifacts(run_id, str(policy_dir), "checkpoint/policy")
        client.log_table(run_id, data=pd.DataFrame(samples), artifact_file="samples/all.json")
        keys = ("objective/scores", "objective/kl", "response/eos_rate", "response/length_mean")
        return {"policy_dir": str(policy_dir), "value_dir": str(value_dir),
                "metrics": {k: last[k] for k in keys if k in last}}

    return run_stage(ctx, "ppo", body)
