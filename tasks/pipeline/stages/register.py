"""register: log and register the policy and the reward model (alias challenger) with lineage tags;
the policy becomes champion when the retrain's gate says so, else by the pipeline's rule
(tasks/pipeline/rule.py). A promotion held for a person's approval leaves the champion in place."""

from __future__ import annotations

from rlhf_core.faults import crash_point, pause_point
from rlhf_core.models.loader import LoadSpec
from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.prepare import base_identity
from tasks.pipeline.rule import (
    Decision,
    champion_evaluation,
    first_champion,
    health_veto,
    register_decision,
    score_key,
    tax_veto,
)
from tasks.pipeline.stages.context import Stage, StageContext
from tasks.pipeline.stages.records import (
    DataRecord,
    ModelRecord,
    PolicyRecord,
    RegisterRecord,
    StageRecord,
)
from tasks.pipeline.stages.run import stage_task
from tasks.pipeline.stages.sft import STAGE as SFT
from tasks.pipeline.stages.tax import over_budget
from tasks.platform.mlflow.guarded import one_try
from tasks.platform.mlflow.registry import (
    CHALLENGER,
    earlier_registration,
    move_champion,
    moved_to,
    set_alias,
    set_version_tags,
    show_on_run,
)
from tasks.platform.mlflow.runs import RunContext, find_stage_run
from tasks.platform.mlflow.tags import (
    ANCESTRY_TAG,
    BASE_MODEL_TAG,
    GATE_TAG,
    HEALTH_FLAGS_TAG,
    HEALTH_STOPPED_TAG,
    PIPELINE_RUN_TAG,
    PPO_RUN_TAG,
    REGISTER_DECISION_TAG,
    REGISTER_REASON_TAG,
    REWARD_MODEL_RUN_TAG,
    SFT_RUN_TAG,
    STARTED_FROM_TAG,
    TAX_OVER_TAG,
)


def policy_card(cfg: PipelineConfig, parent_run_id: str, metrics: dict) -> str:
    """The logged policy's ``model_card.md``: YAML front matter and markdown."""
    base = cfg.model.base_model if not cfg.demo.enabled else "demo GPT-2 (built from a config)"
    lines = "\n".join(f"| `{k}` | {v:.4g} |" for k, v in sorted(metrics.items()))
    return (f"---\ntags: [rlhf, ppo]\n---\n# RLHF policy\n\nPPO policy trained from `{base}` "
            f"by the RLHF pipeline, MLflow parent run `{parent_run_id}`. Check the base model's "
            f"license before use.\n\n| evaluation | value |\n|---|---|\n{lines}\n")


def log_models(run_id: str, tracking_uri: str, policy_dir: str, policy_name: str,
               rm_dir: str, tokenizer_dir: str, rm_name: str, card: str,
               spec: LoadSpec, generation: dict) -> tuple[str, str]:
    """Log and register the policy and reward model pyfuncs (``generation``: the policy's
    sampling defaults) -> their versions."""
    from tasks.platform.mlflow.models import active_run, log_policy, log_reward_model

    with active_run(run_id, tracking_uri):
        version = log_policy(policy_dir, policy_name, generation, card, spec.trust_remote_code)
        crash_point("register:policy_version")
        rm_version = log_reward_model(rm_dir, tokenizer_dir, rm_name, spec.trust_remote_code)
    return version, rm_version


def lineage_tags(ctx: RunContext, rm: ModelRecord, policy: PolicyRecord,
                 lineage: dict | None) -> dict:
    """Where a registered version came from: its runs and, in a retrain, ``lineage``."""
    tags = {PIPELINE_RUN_TAG: ctx.parent_run_id, REWARD_MODEL_RUN_TAG: rm.run_id,
            PPO_RUN_TAG: policy.run_id, STARTED_FROM_TAG: "sft"}
    sft_run = find_stage_run(ctx, SFT.name)
    if sft_run is not None:
        tags[SFT_RUN_TAG] = sft_run.info.run_id
    tags.update({k: str(v) for k, v in (lineage or {}).items()})
    return tags


def health_tags(policy: PolicyRecord) -> dict[str, str]:
    """The PPO run's health findings as version tags (`rlhf promote` reads them)."""
    health = policy.health
    tags = {HEALTH_FLAGS_TAG: ",".join(health.flags)}
    if health.stopped_by is not None:
        tags[HEALTH_STOPPED_TAG] = health.blocks_champion or health.stopped_by
    return tags


def body(sc: StageContext, policy: PolicyRecord, evaluation: StageRecord, rm: ModelRecord,
         data: DataRecord, lineage: dict | None = None,
         decision: Decision | None = None) -> RegisterRecord:
    """``evaluation``: the record whose headline score is compared; ``decision``: the
    retrain gate's, else the pipeline's rule decides."""
    cfg, ctx, run_id = sc.cfg, sc.run, sc.run_id
    if not cfg.tracking.register_models:
        return RegisterRecord(registered=False)
    client = sc.client
    name = cfg.tracking.registered_policy
    key = score_key(evaluation.metrics)
    score = evaluation.metrics[key]
    rm_name = cfg.tracking.registered_reward_model
    # a resume after a crash in here: adopt this run's versions, or remove a partial set
    adopted = earlier_registration(client, (name, rm_name), run_id)
    moved = moved_to(client, name, adopted[0]) if adopted else None
    if moved:
        rule = Decision(promote=True, verdict=moved[0], reason=moved[1])
    elif decision is None:
        rule = register_decision(champion_evaluation(client, name),
                                 getattr(evaluation, "scorer", None), key, score)
        rule = first_champion(rule, evaluation.metrics, getattr(evaluation, "start_scorer", None))
    else:
        rule = decision
    over = over_budget(evaluation.metrics, cfg.eval.tax.budget)
    if not moved:
        # a retrain's run (its lineage) without a gate decision is the loop's bootstrap
        rule = health_veto(rule, policy.health.blocks_champion, cfg.tracking.promote_flagged,
                           gated=decision is not None,
                           bootstrap=decision is None and lineage is not None)
        rule = tax_veto(rule, over, cfg.tracking.promote_flagged)
    card = policy_card(cfg, ctx.parent_run_id, evaluation.metrics)
    pause_point("register:log_models")
    version, rm_version = adopted or one_try(
        client, "register: logging the models", lambda: log_models(
            run_id, ctx.tracking_uri, str(sc.local(policy.policy, "ppo's policy")), name,
            str(sc.local(rm.model, "reward_model's model")),
            str(sc.local(data.tokenizer, "validate's tokenizer")), rm_name, card, sc.spec,
            {"max_new_tokens": cfg.eval.max_new_tokens, "temperature": cfg.eval.temperature}),
        # the server back: keep a whole set it took, or delete a partial one and log again
        lambda: earlier_registration(client, (name, rm_name), run_id))
    tags = {**lineage_tags(ctx, rm, policy, lineage), **health_tags(policy),
            BASE_MODEL_TAG: base_identity(cfg),
            REGISTER_DECISION_TAG: rule.register_tag, REGISTER_REASON_TAG: rule.reason,
            **({TAX_OVER_TAG: over} if over else {})}
    # the chain of versions this one descends from: "v1 -> v2 -> v3"
    tags[ANCESTRY_TAG] = " -> ".join(x for x in (tags.get(ANCESTRY_TAG, ""), f"v{version}") if x)
    if decision is not None:
        tags[GATE_TAG] = decision.reason
    set_version_tags(client, name, version, tags)
    show_on_run(client, ctx.parent_run_id, [(name, version), (rm_name, rm_version)])
    sc.set_tags({REGISTER_DECISION_TAG: rule.register_tag, REGISTER_REASON_TAG: rule.reason})
    sc.set_tags({ANCESTRY_TAG: tags[ANCESTRY_TAG]}, parent=True)
    set_alias(client, name, CHALLENGER, version)
    set_alias(client, rm_name, CHALLENGER, rm_version)
    crash_point("register:challenger")
    held = rule.promote and rule.hold and not moved
    if rule.promote and not moved and not held:  # a held one waits for a person instead
        move_champion(client, name, version, sc.stage.name, rule.reason)
    # a champion is no challenger
    aliases = "candidate, challenger" if held else "champion" if rule.promote else "challenger"
    current = rule.champion_score
    figures = {"policy": f"models:/{name}/{version} ({aliases})",
               "reward model": f"models:/{rm_name}/{rm_version} (challenger)",
               "champion decision": rule.register_tag,
               "champion score before": f"{current:.4g}" if current is not None
               else {"first": "none"}.get(rule.register_tag, "not compared")}
    return RegisterRecord(registered=True, model_name=name, version=int(version),
                          reward_model_name=rm_name, reward_model_version=int(rm_version),
                          promoted=rule.promote and not held, awaiting_approval=held,
                          reason=rule.reason, metrics={key: score}, figures=figures)


STAGE = Stage("register", body, RegisterRecord)
register = stage_task(STAGE)
