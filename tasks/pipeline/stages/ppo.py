"""ppo: PPO from the start policy (the SFT policy, or a retrain's champion) against the reward
model, with the warm-started critic, logging TRL-named metrics, samples and checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pandas as pd

from rlhf_core.config import PPOConfig
from rlhf_core.eval.evaluate import mean_std, rm_judge_gap
from rlhf_core.models.adapters import save_policy_adapter
from rlhf_core.models.checkpoint import save_policy
from rlhf_core.models.loader import load_tokenizer, ppo_models
from rlhf_core.models.scoring import normalise_head
from rlhf_core.ppo.ppo_dist import make_trainer
from tasks.pipeline.identity import ResumeRefused
from tasks.pipeline.judge import resolve_judge
from tasks.pipeline.prepare import Prepared
from tasks.pipeline.rewards import changed_sources, check_reward_sources, reward_mix
from tasks.pipeline.stages.context import Stage, StageContext, peak_memory, state_bytes
from tasks.pipeline.stages.health import HealthLog, make_watch
from tasks.pipeline.stages.records import DataRecord, ModelRecord, NormRecord, PolicyRecord
from tasks.pipeline.stages.reward_model import save_scalar
from tasks.pipeline.stages.run import stage_task
from tasks.pipeline.stages.tax import pretrain_chunks
from tasks.pipeline.stages.token_data import text_ids
from tasks.platform.files import read_json, read_jsonl, write_json
from tasks.platform.mlflow.tags import REWARD_SOURCE_PREFIX


def judge_hooks(judge_name: str, sft_rows: Callable[[], list[dict]], norm_stats: dict):
    """The gold judge's (monitor, add), (None, None) without one: ``monitor``, each iteration's
    mean judge score (``judge/score``); ``add``, (metrics, rows) -> metrics plus the RM-vs-judge
    gain gap in z units (``judge/rm_judge_gap_z``), rows judge-scored."""
    judge = resolve_judge(judge_name)
    if judge is None:
        return None, None

    def monitor(prompts: list[str], responses: list[str], has_eos: list[bool]) -> dict:
        scores = [judge(p, r, e) for p, r, e in zip(prompts, responses, has_eos)]
        return {"judge/score": sum(scores) / len(scores)}

    judge_base = mean_std([judge(r["prompt"], r["response"], True) for r in sft_rows()])
    rm_base = (norm_stats["mean"], norm_stats["std"])

    def add(metrics: dict, rows: list[dict] | None) -> dict:
        if "judge/score" not in metrics:  # the start policy's check: no rollout yet
            return metrics
        for row in rows or []:
            row["judge_score"] = judge(row["prompt"], row["response"], row["has_eos"])
        gap = rm_judge_gap(metrics["objective/raw_scores"], metrics["judge/score"], rm_base,
                           judge_base)
        return {**metrics, **{f"judge/{k}": v for k, v in gap.items()}}

    return monitor, add


def reward_sources(sc: StageContext, data_dir):
    """The reward mix (None: the reward model alone), each source tagged on the run. A resume
    is refused when a source resolves differently under the same settings."""
    cfg = sc.cfg.ppo
    if cfg.reward_sources == PPOConfig().reward_sources and cfg.reward_aggregation == "sum":
        return None
    described = check_reward_sources(cfg, sc.run.tracking_uri)
    if sc.is_main:
        before = {k.removeprefix(REWARD_SOURCE_PREFIX): v for k, v in sc.run_tags().items()
                  if k.startswith(REWARD_SOURCE_PREFIX)}
        moved, reset = changed_sources(before, described)
        if moved:
            raise ResumeRefused("ppo: a reward source changed since the run's PPO began: "
                                + "; ".join(moved) + " (put it back, or start a new run)")
        if reset:
            sc.say("reward sources changed by the resume's settings: " + "; ".join(reset))
        sc.set_tags({REWARD_SOURCE_PREFIX + k: v for k, v in described.items()})
    rows = read_jsonl(data_dir / "prompts.jsonl") if any(
        s.kind != "model" for s in cfg.reward_sources) else []
    return reward_mix(cfg, rows, sc.run.tracking_uri)


def body(sc: StageContext, prep: Prepared, data: DataRecord, start: ModelRecord, rm: ModelRecord,
         norm: NormRecord, critic: ModelRecord, judge: ModelRecord | None = None,
         reference_dir: str | None = None) -> PolicyRecord | None:
    """PPO from ``start`` (KL reference: itself, or ``reference_dir``), health-watched. On
    ranks each rolls out its share; only rank 0 logs, saves and returns the record."""
    cfg, device, spec = sc.cfg, sc.device, sc.spec
    generator = sc.seeded()
    tokenizer = load_tokenizer(sc.local(data.tokenizer, "validate's tokenizer"), spec)
    # no critic for a critic-free estimator; with model.lora: adapters over the trunks
    critic_dir = sc.local(critic.model, "critic_init's model") if cfg.ppo.uses_critic else None
    start_dir = sc.local(start.model, "the start policy")  # here, or downloaded from MLflow
    models = ppo_models(start_dir, reference_dir or start_dir, critic_dir,
                        sc.local(rm.model, "reward_model's model"), spec,
                        new_head=critic.fresh_head)
    norm_stats = norm.stats  # the values reward_norm.json holds
    # the critic starts on the returns' scale: the RM's head is moved off its raw scores'
    # mean; a new head (outputs near 0) was never on the RM's scale, so nothing to undo
    if models.value_model is not None and not critic.fresh_head:
        normalise_head(models.value_model.head, norm_stats, cfg.reward_norm.divide_by_std)
    data_dir = sc.local(data.data, "validate's data")
    # the gate's token ids (memory-mapped; a batch's prompts read when drawn), else encoded
    prompts = text_ids(data_dir / "prompts.jsonl", ("prompt",), tokenizer)[0]
    trainer = make_trainer(models, tokenizer=tokenizer, prompt_ids=prompts, cfg=cfg.ppo,
                           norm_stats=norm_stats, device=device, generator=generator,
                           divide_by_std=cfg.reward_norm.divide_by_std,
                           precision=spec.precision, dp=sc.dp, seed=sc.seed,
                           pretrain_ids=pretrain_chunks(cfg, tokenizer, "ppo"),
                           rewards=reward_sources(sc, data_dir))
    samples_path = sc.dir / "samples.json"  # survives a crash: rows up to the last save
    samples: list[dict] = read_json(samples_path) if samples_path.exists() else []
    log = sc.live(cfg.ppo.iterations)  # MLflow, progress artifact, log line
    monitor, judged = judge_hooks(prep.judge, partial(read_jsonl, data_dir / "sft.jsonl"),
                                  norm_stats)

    def on_iteration(iteration: int, metrics: dict, rows: list[dict] | None) -> None:
        metrics = judged(metrics, rows) if judged else metrics
        log(iteration, metrics)
        if rows:
            samples[:] = [r for r in samples if r["iteration"] < iteration] + rows
            write_json(samples_path, samples)
            sc.log_table(pd.DataFrame(rows), f"samples/iter_{iteration:05d}.json", spooled=True)

    ck = sc.stop_on_outage(trainer.checkpointer(sc.checkpoint_dir, cfg.tracking.keep_checkpoints))
    watch, check_prompts = make_watch(sc, data_dir, judge, prep.judge)
    health = HealthLog(sc, watch, check_prompts) if watch is not None else None
    with peak_memory() as memory:  # under data parallelism: rank 0's
        last = trainer.train(on_iteration, progress=sc.progress, monitor=monitor, checkpointer=ck,
                             watch=watch, on_verdict=health)
    if not sc.is_main:
        return None
    record = _finish(sc, trainer, tokenizer, samples, last, memory, start_dir, critic_dir)
    if health is None:
        return record
    stop, kept = trainer.stopped, trainer.restored_iteration  # the summary shows a stop
    figures = {} if stop is None else {
        "stopped by": f"{stop.detector} at iteration {stop.iteration}",
        "policy kept": "as it was" if kept is None else f"iteration {kept}"}
    return record.model_copy(update={"health": health.record(trainer), "figures": figures})


def _finish(sc: StageContext, trainer, tokenizer, samples: list[dict], last: dict,
            memory: dict, start_dir, critic_dir) -> PolicyRecord:
    """Save memory metrics, the final policy (and critic; LoRA: adapters) and samples."""
    memory["memory/model_state_gb"] = state_bytes(
        trainer.policy, trainer.ref_policy, trainer.value_model, trainer.reward_model,
        optimizer=trainer.optimizer) / 2**30
    sc.log(0, memory)  # not through the progress: it would read 0% again
    policy, value = trainer.policy, trainer.value_model
    if sc.spec.lora is None:
        policy_dir = save_policy(policy, tokenizer, sc.dir / "policy")
    else:  # the adapters over the start policy and the critic's start, alone
        rows = policy.get_input_embeddings().num_embeddings
        policy_dir = save_policy_adapter(policy, tokenizer, sc.dir / "policy", start_dir, rows)
    value_dir = None if value is None else \
        str(save_scalar(value, sc.dir / "value_model", critic_dir, sc.spec))
    sc.log_table(pd.DataFrame(samples), "samples/all.json", spooled=True)
    keys = ("objective/scores", "objective/kl", "response/eos_rate", "response/length_mean")
    return PolicyRecord(policy=sc.publish(policy_dir, "checkpoint/policy"), value_dir=value_dir,
                        metrics={**{k: last[k] for k in keys if k in last}, **memory})


# TRL's names per iteration, some only when their feature is on; check/* at held-out checks
STAGE = Stage("ppo", body, PolicyRecord, sections=("ppo", "model"), seed_offset=2, ranks=True,
              metrics=("objective/kl", "objective/entropy", "objective/non_score_reward",
                       "objective/rlhf_reward", "objective/scores", "objective/raw_scores",
                       "objective/kl_coef", "objective/advantage_abs_mean", "policy/approxkl_avg",
                       "policy/clipfrac_avg", "policy/entropy_avg", "policy/grad_norm_avg",
                       "loss/policy_avg", "loss/value_avg", "loss/kl_loss_avg", "val/clipfrac_avg",
                       "val/ratio", "val/ratio_var", "val/num_eos_tokens", "val/explained_variance",
                       "val/grad_norm_avg", "response/length_mean", "response/length_max",
                       "response/truncated_rate", "response/eos_rate", "lr", "episode", "ptx/loss",
                       "time/rollout_s", "time/update_s", "throughput/tokens_per_s",
                       "reward/*/raw_mean", "reward/*/raw_std", "reward/*/mean", "reward/*/std",
                       "reward/*/abstain_rate", "reward/unscored_rate", "judge/score",
                       "judge/rm_gain_z", "judge/judge_gain_z", "judge/rm_judge_gap_z",
                       "check/proxy_score", "check/judge_score", "check/gold_score", "check/kl",
                       "check/length_mean", "check/eos_rate", "check/distinct_rate",
                       "check/rm_drift", "time/check_s", "memory/peak_rss_gb", "memory/peak_gpu_gb",
                       "memory/model_state_gb"),
              artifacts=("samples/iter_*.json", "samples/all.json", "checks/iter_*.json",
                         "health.json", "checkpoint/policy"))
ppo = stage_task(STAGE)
