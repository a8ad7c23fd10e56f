"""Stage tasks 7-8: evaluate SFT vs PPO on held-out prompts; register the models."""

from __future__ import annotations

import pandas as pd
from prefect import task

from rlhf_core.evaluate import compare_policies, sample_policy
from rlhf_core.faults import crash_point, pause_point
from rlhf_core.loader import LoadSpec, load_policy, load_scalar_model, load_tokenizer
from rlhf_core.optim import seed_everything
from tasks.artifacts import local_path
from tasks.champion_rule import (
    DECISION_TAG,
    REASON_TAG,
    SCORER_TAG,
    champion_evaluation,
    eval_scorer,
    register_decision,
    score_key,
)
from tasks.common import metric_logger, read_jsonl, run_stage, setup_models, stage_params
from tasks.config import PipelineConfig
from tasks.guarded import one_try
from tasks.judge import resolve_judge
from tasks.progress import StageProgress
from tasks.registry import (
    CHALLENGER,
    earlier_registration,
    move_champion,
    moved_to,
    set_alias,
    show_on_run,
)
from tasks.tracking import RunContext, find_stage_run, set_tags


def _table_artifact(rows: list[dict]) -> None:
    try:
        from prefect.artifacts import create_table_artifact

        create_table_artifact(key="rlhf-eval-samples", table=rows,
                              description="SFT vs PPO, side by side")
    except Exception:  # noqa: BLE001 - outside a Prefect run there is no artifact store
        pass


@task(name="evaluate")
def evaluate(ctx: RunContext, cfg: PipelineConfig, prep: dict, data: dict, sft_out: dict,
             rm_out: dict, ppo_out: dict) -> dict:
    """Sample both policies on held-out prompts; RM score, KL, EOS rate, judge win rate."""

    def body(run_id: str) -> dict:
        device, spec = setup_models(cfg.model)
        seed_everything(ctx.seed + 3)
        tokenizer = load_tokenizer(local_path(ctx, data, "tokenizer"), spec)
        ref = load_policy(local_path(ctx, sft_out, "model_dir"), spec,
                          trainable=False).to(device)
        policy = load_policy(local_path(ctx, ppo_out, "policy_dir"), spec,
                             trainable=False).to(device)
        rm = load_scalar_model(local_path(ctx, rm_out, "model_dir"), spec,
                               trainable=False).to(device)
        data_dir = local_path(ctx, data, "data_dir")
        path = data_dir / "eval_prompts.jsonl"
        if not path.exists():
            path = data_dir / "prompts.jsonl"
        prompts = [r["prompt"] for r in read_jsonl(path)][: cfg.eval.num_prompts]
        e = cfg.eval
        live = StageProgress("evaluate", 2)
        live(0)
        sft_samples = sample_policy(ref, None, rm, tokenizer, prompts, e.temperature,
                                    e.max_new_tokens, device, e.batch_size, spec.precision)
        live(1)  # SFT policy sampled
        pol_samples = sample_policy(policy, ref, rm, tokenizer, prompts, e.temperature,
                                    e.max_new_tokens, device, e.batch_size, spec.precision)
        live(2)  # PPO policy sampled
        metrics, rows = compare_policies(sft_samples, pol_samples, prompts,
                                         resolve_judge(prep["judge"]))
        pause_point("evaluate:scored")
        client = ctx.client()
        scorer = eval_scorer(prep["judge"], rm_out.get("run_id", ""), prompts)
        set_tags(client, ctx.parent_run_id, {SCORER_TAG: scorer})
        metric_logger(ctx, run_id)(0, metrics)
        metric_logger(ctx, ctx.parent_run_id)(0, metrics)
        table = pd.DataFrame(rows)
        client.log_table(run_id, data=table, artifact_file="eval/side_by_side.json")
        _table_artifact(rows[: e.num_side_by_side])
        first = ("eval/judge_win_rate", "eval/judge_score_policy", "eval/judge_score_sft",
                 "eval/kl_to_ref", "eval/eos_rate_policy")
        ordered = {k: metrics[k] for k in first if k in metrics}
        return {"metrics": {**ordered, **metrics}, "scorer": scorer}

    return run_stage(ctx, "evaluate", body, stage_params(cfg, "eval"))


def policy_card(cfg: PipelineConfig, parent_run_id: str, metrics: dict) -> str:
    """Model card text (YAML front matter + markdown), stored with the logged policy as its
    artifact ``model_card.md``."""
    base = cfg.model.base_model if not cfg.demo.enabled else "demo GPT-2 (built from a config)"
    lines = "\n".join(f"| `{k}` | {v:.4g} |" for k, v in sorted(metrics.items()))
    return (f"---\ntags: [rlhf, ppo]\n---\n# RLHF policy\n\nPPO policy trained from `{base}` "
            f"by the RLHF pipeline, MLflow parent run `{parent_run_id}`. Check the base model's "
            f"license before use.\n\n| evaluation | value |\n|---|---|\n{lines}\n")


def log_models(run_id: str, tracking_uri: str, policy_dir: str, policy_name: str,
               rm_dir: str, tokenizer_dir: str, rm_name: str, card: str,
               spec: LoadSpec, generation: dict) -> tuple[str, str]:
    """Log and register the policy (pyfunc answering prompts with their completion;
    ``generation``: its default max_new_tokens and temperature) and the reward model (pyfunc
    scoring prompt/response) in the register run -> their versions."""
    import mlflow

    from tasks.mlflow_models import log_policy, log_reward_model, mlflow_pointed_at

    with mlflow_pointed_at(tracking_uri), mlflow.start_run(run_id=run_id):
        version = log_policy(policy_dir, policy_name, generation, card, spec.trust_remote_code)
        crash_point("register:policy_version")
        rm_version = log_reward_model(rm_dir, tokenizer_dir, rm_name, spec.trust_remote_code)
    return version, rm_version


def lineage_tags(ctx: RunContext, rm_out: dict, ppo_out: dict, lineage: dict | None) -> dict:
    """What a registered version records of where it came from: its MLflow parent run, the
    reward-model and PPO runs, and (retrain) its data batches and the champion it started
    from."""
    tags = {"rlhf.parent_run_id": ctx.parent_run_id,
            "rlhf.reward_model_run_id": rm_out.get("run_id", ""),
            "rlhf.ppo_run_id": ppo_out.get("run_id", ""), "rlhf.started_from": "sft"}
    sft_run = find_stage_run(ctx, "sft")
    if sft_run is not None:
        tags["rlhf.sft_run_id"] = sft_run.info.run_id
    tags.update({k: str(v) for k, v in (lineage or {}).items()})
    return tags


@task(name="register")
def register(ctx: RunContext, cfg: PipelineConfig, ppo_out: dict, eval_out: dict,
             rm_out: dict, data: dict, lineage: dict | None = None,
             decision: dict | None = None) -> dict:
    """Register the policy and the reward model (alias challenger) with lineage tags. The
    policy becomes champion when ``decision`` says so (retrain gate), else by the pipeline's
    rule (tasks/champion_rule.py): no champion yet, or it beats the champion's evaluation
    score by the same scorer on the same prompts; the old champion keeps previous-champion."""

    def body(run_id: str) -> dict:
        if not cfg.tracking.register_models:
            return {"registered": False, "metrics": {}}
        client = ctx.client()
        name = cfg.tracking.registered_policy
        key = score_key(eval_out["metrics"])
        score = eval_out["metrics"][key]
        rm_name = cfg.tracking.registered_reward_model
        # a resume after a crash in here: adopt this run's versions, or remove a partial set
        adopted = earlier_registration(client, (name, rm_name), run_id)
        moved = moved_to(client, name, adopted[0]) if adopted else None
        rule = moved or register_decision(champion_evaluation(client, name),
                                          eval_out.get("scorer"), key, score) \
            if decision is None else \
            {"promote": bool(decision["promote"]), "reason": decision["reason"],
             "decision": "gate: " + ("promote" if decision["promote"] else "keep"),
             "champion_score": None}
        card = policy_card(cfg, ctx.parent_run_id, eval_out["metrics"])
        pause_point("register:log_models")
        version, rm_version = adopted or one_try(
            client, "register: logging the models", lambda: log_models(
                run_id, ctx.tracking_uri, str(local_path(ctx, ppo_out, "policy_dir")), name,
                str(local_path(ctx, rm_out, "model_dir")),
                str(local_path(ctx, data, "tokenizer")), rm_name, card,
                setup_models(cfg.model)[1], {"max_new_tokens": cfg.eval.max_new_tokens,
                                             "temperature": cfg.eval.temperature}),
            # the server back: keep a whole set it took, or delete a partial one and log again
            lambda: earlier_registration(client, (name, rm_name), run_id))
        tags = {**lineage_tags(ctx, rm_out, ppo_out, lineage),
                DECISION_TAG: rule["decision"], REASON_TAG: rule["reason"]}
        # the chain of versions this one descends from: "v1 -> v2 -> v3"
        tags["rlhf.ancestry"] = " -> ".join(
            x for x in (tags.get("rlhf.ancestry", ""), f"v{version}") if x)
        if decision is not None:
            tags["rlhf.gate"] = decision["reason"]
        for tag, value in tags.items():
            client.set_model_version_tag(name, str(version), tag, value)
        show_on_run(client, ctx.parent_run_id, [(name, version), (rm_name, rm_version)])
        set_tags(client, run_id, {DECISION_TAG: rule["decision"], REASON_TAG: rule["reason"]})
        set_tags(client, ctx.parent_run_id, {"rlhf.ancestry": tags["rlhf.ancestry"]})
        set_alias(client, name, CHALLENGER, version)
        set_alias(client, rm_name, CHALLENGER, rm_version)
        crash_point("register:challenger")
        if rule["promote"] and not moved:
            move_champion(client, name, version, "register", rule["reason"])
        aliases = "challenger, champion" if rule["promote"] else "challenger"
        current = rule["champion_score"]
        figures = {"policy": f"models:/{name}/{version} ({aliases})",
                   "reward model": f"models:/{rm_name}/{rm_version} (challenger)",
                   "champion decision": rule["decision"],
                   "champion score before": f"{current:.4g}" if current is not None
                   else {"first": "none"}.get(rule["decision"], "not compared")}
        return {"registered": True, "model_name": name, "version": int(version),
                "reward_model_name": rm_name, "reward_model_version": int(rm_version),
                "promoted": rule["promote"], "metrics": {key: score}, "figures": figures}

    return run_stage(ctx, "register", body)
