"""Retrain stage: challenger vs champion on the fixed held-out prompts, one scorer for both
(the gold judge when the data has one, else the new reward model), paired bootstrap test and
guard rails (rlhf_core/gate.py). The decision is a set of MLflow tags on the retrain run and
a Prefect markdown artifact."""

from __future__ import annotations

from prefect import task

from rlhf_core.evaluate import sample_policy
from rlhf_core.gate import gate_decision
from rlhf_core.loader import load_policy, load_scalar_model, load_tokenizer
from rlhf_core.optim import seed_everything
from tasks.artifacts import local_path
from tasks.common import metric_logger, read_jsonl, run_stage, setup_models
from tasks.config import PipelineConfig
from tasks.judge import resolve_judge
from tasks.retrain import GateError, report
from tasks.tracking import RunContext, run_url, set_tags


def _scorer(cfg: PipelineConfig, prep: dict):
    """(name, judge function or None for the reward model)."""
    wanted = cfg.retrain.gate.scorer
    judge = resolve_judge(prep["judge"])  # the run's one resolved judge (eval.judge)
    if wanted == "judge" and judge is None:
        raise GateError("retrain.gate.scorer is 'judge' but the data has no gold judge")
    if judge is not None and wanted != "reward_model":
        return "gold judge", judge
    return "new reward model", None


def _scores(samples: dict, prompts: list[str], judge) -> list[float]:
    if judge is None:
        return list(samples["score"])
    return [judge(p, r, bool(e)) for p, r, e in
            zip(prompts, samples["response"], samples["has_eos"])]


def decision_markdown(ctx: RunContext, run_id: str, decision: dict, scorer: str,
                      champion_version: str) -> str:
    f = decision["figures"]
    verdict = "PROMOTE challenger" if decision["promote"] else \
        f"KEEP champion v{champion_version}"
    rows = "\n".join(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
                     for k, v in f.items())
    return (f"# Retrain decision: {verdict}\n\n{decision['reason']}\n\nScorer: {scorer} (the "
            f"same for both policies). Champion: v{champion_version}.\n\n| figure | value |\n"
            f"|---|---|\n{rows}\n\nMLflow: {run_url(ctx, run_id)}\n")


@task(name="gate")
def gate(ctx: RunContext, cfg: PipelineConfig, prep: dict, data: dict, champion: dict,
         ppo_out: dict, rm_out: dict, reference_dir: str) -> dict:
    """Sample champion and challenger on the same held-out prompts; decide."""

    def body(run_id: str) -> dict:
        g, e = cfg.retrain.gate, cfg.eval
        device, spec = setup_models(cfg.model)
        tokenizer = load_tokenizer(local_path(ctx, data, "tokenizer"), spec)
        prompts = [r["prompt"] for r in read_jsonl(
            local_path(ctx, data, "data_dir") / "eval_prompts.jsonl")][: g.num_prompts]
        reference = load_policy(reference_dir, spec, trainable=False).to(device)
        rm = load_scalar_model(local_path(ctx, rm_out, "model_dir"), spec,
                               trainable=False).to(device)
        samples = {}
        for side, path in (("champion", champion["policy_dir"]),
                           ("challenger", local_path(ctx, ppo_out, "policy_dir"))):
            seed_everything(ctx.seed + 4)  # same sampling noise for both sides
            policy = load_policy(path, spec, trainable=False).to(device)
            samples[side] = sample_policy(policy, reference, rm, tokenizer, prompts,
                                          e.temperature, e.max_new_tokens, device, e.batch_size,
                                          spec.precision)
        scorer, judge = _scorer(cfg, prep)
        champ, chall = (_scores(samples[s], prompts, judge) for s in ("champion", "challenger"))
        decision = gate_decision(
            champ, chall, samples["champion"]["has_eos"], samples["challenger"]["has_eos"],
            samples["challenger"]["kl"], min_prompts=g.min_prompts, margin=g.margin,
            confidence=g.confidence, n_bootstrap=g.n_bootstrap, max_eos_drop=g.max_eos_drop,
            max_kl=g.max_kl, seed=ctx.seed)
        metrics = {f"gate/{k}": float(v) for k, v in decision["figures"].items()}
        metrics["gate/promote"] = float(decision["promote"])
        metric_logger(ctx, run_id)(0, metrics)
        metric_logger(ctx, ctx.parent_run_id)(0, metrics)
        key = "eval/judge_score_policy" if judge else "eval/rm_score_policy"
        tags = {"rlhf.gate.decision": "promote" if decision["promote"] else "keep",
                "rlhf.gate.reason": decision["reason"], "rlhf.gate.scorer": scorer,
                **{f"rlhf.gate.{k}": f"{v:.6g}" if isinstance(v, float) else str(v)
                   for k, v in decision["figures"].items()}}
        set_tags(ctx.client(), ctx.parent_run_id, tags)
        set_tags(ctx.client(), run_id, tags)
        report("rlhf-retrain-decision",
               decision_markdown(ctx, run_id, decision, scorer, champion["version"]),
               "retrain: challenger vs champion")
        return {"decision": {"promote": decision["promote"], "reason": decision["reason"]},
                "metrics": {key: decision["figures"]["score_challenger"], **metrics},
                "figures": {"decision": tags["rlhf.gate.decision"], "scorer": scorer}}

    return run_stage(ctx, "gate", body)
