"""The retrain flow: new preference batches through the pipeline's stages (flows/wiring.py) from
the champion, gated against it; the champion moves only on a win, and with no champion yet the
whole pipeline's result becomes champion. One retrain at a time: a run finding one skips or
waits. And the compare flow: two registered policy versions through the retrain's gate.

No ``from __future__ import annotations`` (Prefect reads the signature's classes).
"""

from prefect import flow

from flows.deployment import SERVED, served_config
from flows.wiring import run_pipeline, tracked
from tasks.config.pipeline_config import ConfigError, PipelineConfig
from tasks.pipeline.finish import finish
from tasks.pipeline.prepare import prepare
from tasks.pipeline.stages.records import Artifact, ModelRecord, PolicyRecord, RegisterRecord
from tasks.pipeline.stages.validate import validate
from tasks.platform.prefect.prefect_api import flow_run_name, rename_flow_run, slot_holder
from tasks.retrain.approval import waiting
from tasks.retrain.batches import find_batches
from tasks.retrain.gate.champion import champion_version, fetch_champion
from tasks.retrain.gate.stage import gate, resolve_scorer
from tasks.retrain.labels.imports import import_dropped
from tasks.retrain.records import Batch, CompareResult, GateRecord, RetrainResult, Round
from tasks.retrain.round import (
    control_run_name,
    limit_name,
    refused_batches,
    report_first_champion,
    report_nothing_new,
    report_skipped,
    retrain_run_name,
    retrain_slot,
    round_settings,
)


def bootstrap(config: PipelineConfig, batches: list[Batch]) -> RetrainResult:
    """No champion yet: the whole pipeline on the data + batches; its result is champion.
    With the judge_model scorer, the judge's held-out pairs are kept from the reward model
    here already, so later challengers' judges share no pair with any RM before them."""
    result = run_pipeline(config, run_name=flow_run_name(), retrain=Round(batches=batches))
    report_first_champion(len(batches), result.parent_run_id)
    return RetrainResult(status="bootstrapped", run=result)


def challenge(config: PipelineConfig, batches: list[Batch],
              consumed: list[Batch] | None = None, control: bool = False) -> RetrainResult:
    """Retrain from the champion on the new batches (+ consumed ones, ``rm_data: cumulative``);
    the gate decides. ``control``: the same round on the consumed batches alone, nothing
    registered or consumed. Params record the round's settings, not the first run's."""
    config = round_settings(config)
    result = run_pipeline(config, run_name=flow_run_name(), retrain=Round(
        batches=batches, consumed=consumed, challenge=True, control=control))
    gate_out, reg = result.stages["gate"], result.stages.get("register")
    assert isinstance(gate_out, GateRecord)
    decision = waiting.held_for_approval(config, gate_out.decision)
    if not isinstance(reg, RegisterRecord):
        return RetrainResult(status="control", decision=decision, run=result)
    if reg.awaiting_approval:
        return RetrainResult(status="awaiting approval", decision=decision, run=result,
                             candidate=reg.version)
    # the register stage may keep a champion the gate would change (a flagged challenger)
    promoted = reg.promoted if reg.registered else decision.promote
    return RetrainResult(status="promoted" if promoted else "kept", decision=decision, run=result)


@flow(name="retrain", flow_run_name="retrain", log_prints=True)
def retrain(config: PipelineConfig = SERVED, control: bool = False) -> RetrainResult:
    """Consume new preference batches from ``retrain.watch_dir``: retrain from the champion
    and promote the challenger only when the gate says so.

    Args:
        config: The served pipeline config; its ``retrain`` section sets the watched
            folder, the schedule, the data/initialisation choices and the gate.
        control: A control round: the same retrain on the batches consumed so far, gated
            and recorded, nothing registered or moved: what a round's new labels add.
    """
    config = served_config(config)  # a custom run's fields over the served config
    answered = waiting.resumed_round(config)  # a served round resumed with a person's answer
    if answered is not None:
        waiting.publish_answer(config, answered)
        return answered
    waiting.settle_approvals(config)  # deadlines passed, answers left half done
    with retrain_slot(config) as acquired:
        if not acquired:
            holder = slot_holder(limit_name(config))
            report_skipped(config, holder)
            return RetrainResult(status="skipped", slot=limit_name(config), held_by=holder)
        import_dropped(config)  # labelled files in the watch folder -> batches or quarantine
        batches = find_batches(config)
        champion = champion_version(config)
        if control:
            rename_flow_run(control_run_name(config, champion and str(champion.version)))
            return challenge(config, [], batches.consumed, control=True)
        rename_flow_run(retrain_run_name(config.tracking.registered_policy,
                                         champion and str(champion.version),
                                         [b.digest for b in batches.new]))
        if champion is not None and not batches.new:
            report_nothing_new(config, len(batches.consumed))
            return RetrainResult(status="nothing new", consumed=len(batches.consumed))
        with refused_batches(config, batches.new, first=champion is None):
            result = bootstrap(config, batches.new) if champion is None else \
                challenge(config, batches.new, batches.consumed)
        waiting.publish_outcome(config, result)
    if result.status == "awaiting approval":
        return waiting.ask_for_approval(config, result)  # served: the process ends till answered
    return result


@flow(name="compare", flow_run_name="compare", log_prints=True)
def compare(config: PipelineConfig, champion: str = "1",
            challenger: str = "champion") -> CompareResult:
    """Two registered policy versions (numbers or aliases) through the retrain's gate: both
    answer its held-out prompts, one scorer scores both, the paired bootstrap test decides.
    Nothing trained, no alias moved; recorded as ``rlhf.compare.*`` tags."""
    prep = prepare(config)
    ctx = prep.ctx
    with tracked(ctx, config):
        if resolve_scorer(config, prep.judge) == "judge_model":
            raise ConfigError("rlhf compare: the judge_model scorer is trained in a retrain; "
                              "set retrain.gate.scorer to judge or models:/<name>@<alias>")
        base = fetch_champion(ctx, config, champion)
        other = fetch_champion(ctx, config, challenger)
        if str(base.version) == str(other.version):
            raise ConfigError(f"rlhf compare: '{champion}' and '{challenger}' are both "
                              f"v{base.version}: a version compared with itself says "
                              "nothing; name two different versions")
        compared = f"v{other.version} against v{base.version}"
        rename_flow_run(f"compare-{config.tracking.registered_policy}-v{other.version}-"
                        f"against-v{base.version}")
        data = validate(ctx, config, prep)
        gate_out = gate(ctx, config, prep, data, base,
                        PolicyRecord(policy=Artifact(path=other.policy_dir)),
                        ModelRecord(model=Artifact(path=other.rm_dir)), base.sft_dir,
                        compared=compared)
    result = finish(ctx, {"validate": data, "gate": gate_out}, config.tracking.keep_resume_state)
    return CompareResult(champion=int(base.version), challenger=int(other.version),
                         decision=gate_out.decision, run=result)
