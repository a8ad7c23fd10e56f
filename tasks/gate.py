"""Retrain stage: challenger vs champion on the fixed held-out prompts, one scorer for both
(tasks/gate_judge.py: the gold judge when the data has one, else a judge reward model trained
on held-out pairs, or an external registered scorer), paired bootstrap test and guard rails
(rlhf_core/gate.py). The decision is a set of MLflow tags on the retrain run and a Prefect
markdown artifact; where a gold judge exists and another scorer decided, what the gold judge
would have decided is recorded beside it (``rlhf.gate.gold.*``)."""

from __future__ import annotations

from prefect import task

from rlhf_core.evaluate import sample_policy
from rlhf_core.gate import gate_decision
from rlhf_core.loader import load_policy, load_scalar_model, load_tokenizer
from rlhf_core.optim import seed_everything
from rlhf_core.serving import score_rows
from tasks.artifacts import local_path
from tasks.common import metric_logger, read_jsonl, run_stage, setup_models
from tasks.config import PipelineConfig
from tasks.gate_judge import external_scores, load_external, resolve_scorer, scorer_label
from tasks.judge import resolve_judge
from tasks.retrain import GateError, report
from tasks.tracking import RunContext, run_url, set_tags


def _scores(ctx: RunContext, scorer: str, samples: dict, prompts: list[str], gold,
            judge_out: dict | None, tokenizer, spec, device) -> dict[str, list[float]]:
    """Both sides' per-prompt scores by ``scorer`` -> {"champion": [...], "challenger": [...]}."""
    sides = ("champion", "challenger")
    if scorer == "reward_model":
        return {s: list(samples[s]["score"]) for s in sides}
    if scorer == "judge":
        return {s: [gold(p, r, bool(e)) for p, r, e in zip(
            prompts, samples[s]["response"], samples[s]["has_eos"])] for s in sides}
    if scorer == "judge_model":
        if judge_out is None:
            raise GateError("retrain.gate.scorer judge_model: no judge reward model trained")
        model = load_scalar_model(local_path(ctx, judge_out, "model_dir"), spec,
                                  trainable=False).to(device)
        return {s: score_rows(model, tokenizer, prompts, samples[s]["response"])
                for s in sides}
    model = load_external(scorer, ctx.tracking_uri)
    return {s: external_scores(model, prompts, samples[s]["response"]) for s in sides}


def _decide(scores: dict, samples: dict, g, seed: int) -> dict:
    return gate_decision(
        scores["champion"], scores["challenger"], samples["champion"]["has_eos"],
        samples["challenger"]["has_eos"], samples["challenger"]["kl"],
        min_prompts=g.min_prompts, margin=g.margin, confidence=g.confidence,
        n_bootstrap=g.n_bootstrap, max_eos_drop=g.max_eos_drop, max_kl=g.max_kl, seed=seed)


def _gold_tags(decision: dict, gold_decision: dict) -> dict:
    """What the gold judge would have decided (agreement of the scorer with it)."""
    f = gold_decision["figures"]
    tags = {"rlhf.gate.gold.decision": "promote" if gold_decision["promote"] else "keep",
            "rlhf.gate.gold.agrees": str(gold_decision["promote"] == decision["promote"])}
    tags.update({f"rlhf.gate.gold.{k}": f"{f[k]:.6g}" for k in ("diff_mean", "ci_low",
                                                                  "ci_high") if k in f})
    return tags


def decision_markdown(ctx: RunContext, run_id: str, decision: dict, scorer: str,
                      champion_version: str, gold_tags: dict | None = None) -> str:
    f = decision["figures"]
    verdict = "PROMOTE challenger" if decision["promote"] else \
        f"KEEP champion v{champion_version}"
    rows = "\n".join(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
                     for k, v in f.items())
    return (f"# Retrain decision: {verdict}\n\n{decision['reason']}\n\nScorer: {scorer} (the "
            f"same for both policies). Champion: v{champion_version}.\n\n| figure | value |\n"
            f"|---|---|\n{rows}\n\n{_gold_line(gold_tags or {})}"
            f"MLflow: {run_url(ctx, run_id)}\n")


def _gold_line(tags: dict) -> str:
    if not tags:
        return ""
    low, high = tags.get("rlhf.gate.gold.ci_low", "n/a"), tags.get("rlhf.gate.gold.ci_high", "n/a")
    return (f"The gold judge would have decided: {tags['rlhf.gate.gold.decision']} (mean "
            f"diff {tags.get('rlhf.gate.gold.diff_mean', 'n/a')}, CI [{low}, {high}]).\n\n")


@task(name="gate")
def gate(ctx: RunContext, cfg: PipelineConfig, prep: dict, data: dict, champion: dict,
         ppo_out: dict, rm_out: dict, reference_dir: str,
         judge_out: dict | None = None) -> dict:
    """Sample champion and challenger on the same held-out prompts; score both with the
    configured scorer (``judge_out``: the held-out judge reward model); decide."""

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
        scorer, gold = resolve_scorer(cfg, prep["judge"]), resolve_judge(prep["judge"])
        if scorer == "judge" and gold is None:
            raise GateError("retrain.gate.scorer is 'judge' but the data has no gold judge")
        scores = _scores(ctx, scorer, samples, prompts, gold, judge_out, tokenizer, spec,
                         device)
        decision = _decide(scores, samples, g, ctx.seed)
        gold_tags = {} if gold is None or scorer == "judge" else _gold_tags(
            decision, _decide(_scores(ctx, "judge", samples, prompts, gold, None, tokenizer,
                                      spec, device), samples, g, ctx.seed))
        metrics = {f"gate/{k}": float(v) for k, v in decision["figures"].items()}
        metrics["gate/promote"] = float(decision["promote"])
        metric_logger(ctx, run_id)(0, metrics)
        metric_logger(ctx, ctx.parent_run_id)(0, metrics)
        key = "eval/judge_score_policy" if scorer == "judge" else "eval/rm_score_policy"
        label = scorer_label(scorer)
        tags = {"rlhf.gate.decision": "promote" if decision["promote"] else "keep",
                "rlhf.gate.reason": decision["reason"], "rlhf.gate.scorer": label,
                "rlhf.gate.scorer_id": scorer, **gold_tags,
                **{f"rlhf.gate.{k}": f"{v:.6g}" if isinstance(v, float) else str(v)
                   for k, v in decision["figures"].items()}}
        set_tags(ctx.client(), ctx.parent_run_id, tags)
        set_tags(ctx.client(), run_id, tags)
        report("rlhf-retrain-decision",
               decision_markdown(ctx, run_id, decision, label, champion["version"], gold_tags),
               "retrain: challenger vs champion")
        return {"decision": {"promote": decision["promote"], "reason": decision["reason"],
                             "scorer": label},
                "metrics": {key: decision["figures"]["score_challenger"], **metrics},
                "figures": {"decision": tags["rlhf.gate.decision"], "scorer": label}}

    return run_stage(ctx, "gate", body)
