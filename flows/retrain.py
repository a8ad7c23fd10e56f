"""The retrain flow: new preference batches (+ every consumed one, ``rm_data: cumulative``)
-> validate -> [judge split -> judge reward model, when the gate's scorer is judge_model] ->
reward model -> PPO from the champion -> gate against the champion -> register (champion
moves only on a win; the version records its ancestry and the batches it was trained on).

No new batch: nothing trains, the run ends in seconds. No champion yet: the whole pipeline
runs on the data plus the batches and its result becomes champion. One retrain at a time
(a Prefect global concurrency limit); a run that finds one running skips or waits.

No ``from __future__ import annotations`` (Prefect reads the signature's classes).
"""

from prefect import flow

from flows.deployment import SERVED, served_config
from flows.wiring import run_pipeline, tracked, train_policy
from tasks.config import ConfigError, PipelineConfig
from tasks.finish import finish
from tasks.prepare import Prepared, prepare
from tasks.results import CompareResult, RetrainResult
from tasks.retrain.approval.waiting import (
    ask_for_approval,
    awaiting_text,
    held_for_approval,
    publish_answer,
    resumed_round,
    settle_approvals,
)
from tasks.retrain.batches import (
    add_batches,
    fetch_champion,
    find_batches,
    mark_consumed,
)
from tasks.retrain.records import Batch
from tasks.retrain.round import (
    limit_name,
    lineage_tags,
    named_batch_rows,
    refused_batches,
    report_first_champion,
    report_nothing_new,
    report_skipped,
    retrain_slot,
    round_settings,
    round_start,
)
from tasks.retrain.scorers import batch_pair_keys, resolve_scorer
from tasks.runtime.prefect_api import flow_run_name, rename_flow_run, slot_holder
from tasks.stages.gate import gate
from tasks.stages.judge_model import judge_model, judge_split
from tasks.stages.records import Artifact, DataRecord, ModelRecord, PolicyRecord
from tasks.stages.register import register
from tasks.stages.validate import validate
from tasks.summary import publish_summary
from tasks.tracking.registry import RegistryError
from tasks.tracking.runs import RunContext


def bootstrap(config: PipelineConfig, batches: list[Batch]) -> RetrainResult:
    """No champion yet: the whole pipeline on the data + batches; its result is champion.
    With the judge_model scorer, the judge's held-out pairs are kept from the reward model
    here already, so later challengers' judges share no pair with any RM before them."""
    rows: list[dict] = []
    lineage: dict = {}
    run: dict = {}  # the run's context and resolved gold judge, known once prepared

    def with_batches(ctx: RunContext, prep: Prepared) -> Prepared:
        out = add_batches(ctx, config, prep, batches)
        rows.extend(out.batch_rows)
        lineage.update(lineage_tags(out, batches))
        run.update(ctx=ctx, judge=out.judge)
        return out

    def split(ctx: RunContext, data: DataRecord) -> DataRecord:
        if resolve_scorer(config, run["judge"]) != "judge_model":
            return data  # a gold judge scores the gate: every pair trains the RM
        return judge_split(ctx, config, data)

    with named_batch_rows(rows):
        result = run_pipeline(config, prep_hook=with_batches, lineage=lineage,
                              data_hook=split, run_name=flow_run_name())
    mark_consumed(run["ctx"], batches)
    report_first_champion(len(batches), result.parent_run_id)
    return RetrainResult(status="bootstrapped", run=result)


def challenge(config: PipelineConfig, batches: list[Batch],
              consumed: list[Batch] | None = None, control: bool = False) -> RetrainResult:
    """Retrain from the champion on the new batches (and, ``rm_data: cumulative``, every
    batch consumed before); the gate decides on promotion. ``control``: the same round on
    the consumed batches alone, gated and recorded, but nothing registered or consumed.
    The run is prepared (and its params recorded) with the settings it trains with
    (``retrain.ppo_iterations``, ``retrain.rm_epochs``), not the first run's."""
    config = round_settings(config)
    prep = prepare(config, run_name=flow_run_name())
    ctx = prep.ctx
    with tracked(ctx, config):
        champion = fetch_champion(ctx, config)
        prep = add_batches(ctx, config, prep, batches, champion, consumed)
        with named_batch_rows(prep.batch_rows):
            data = validate(ctx, config, prep)
        start = round_start(config, champion)
        rm_data, judge_out = data, None
        if resolve_scorer(config, prep.judge) == "judge_model":
            rm_data = judge_split(ctx, config, data, batch_pair_keys(prep))
            judge_out = judge_model(ctx, config, rm_data,
                                    ModelRecord(model=Artifact(path=champion.sft_dir)))
        trained = train_policy(ctx, config, prep, rm_data,
                               ModelRecord(model=Artifact(path=start.policy)),
                               rm_init_dir=start.rm_init, reference_dir=start.reference,
                               judge=judge_out)
        gate_out = gate(ctx, config, prep, data, champion, trained["ppo"],
                        trained["reward_model"], start.reference, judge_out)
        decision = held_for_approval(config, gate_out.decision)
        if control:
            result = finish(ctx, {"validate": data, **trained, "gate": gate_out},
                            config.tracking.keep_resume_state)
            return RetrainResult(status="control", decision=decision, run=result)
        lineage = lineage_tags(prep, batches, champion, decision.scorer)
        reg = register(ctx, config, trained["ppo"], gate_out, trained["reward_model"], data,
                       lineage=lineage, decision=decision)
        mark_consumed(ctx, batches)
    result = finish(ctx, {"validate": data, **trained, "gate": gate_out, "register": reg},
                    config.tracking.keep_resume_state)
    if reg.awaiting_approval:
        return RetrainResult(status="awaiting approval", decision=decision, run=result,
                             candidate=reg.version)
    # the register stage may keep a champion the gate would change (a flagged challenger)
    promoted = reg.promoted if reg.registered else decision.promote
    return RetrainResult(status="promoted" if promoted else "kept", decision=decision,
                         run=result)


@flow(name="retrain", flow_run_name="retrain", log_prints=True)
def retrain(config: PipelineConfig = SERVED, control: bool = False) -> RetrainResult:
    """Consume new preference batches from ``retrain.watch_dir``: retrain from the champion
    and promote the challenger only when the gate says so.

    Args:
        config: The served pipeline config; its ``retrain`` section sets the watched
            folder, the schedule, the data/initialisation choices and the gate.
        control: A control round: the same retrain on the batches consumed so far (new
            ones stay new), gated against the champion and recorded; nothing registered,
            no alias moved. It shows what a round's new labels add.
    """
    from tasks.retrain.batches import champion_version
    from tasks.retrain.events import announce_outcome, retrain_run_name
    from tasks.retrain.labels.imports import import_dropped

    config = served_config(config)  # a custom run's fields over the served config
    answered = resumed_round(config)  # a served round resumed with a person's answer
    if answered is not None:
        publish_answer(config, answered)
        return answered
    settle_approvals(config)  # deadlines passed, answers left half done
    with retrain_slot(config) as acquired:
        if not acquired:
            holder = slot_holder(limit_name(config))
            report_skipped(config, holder)
            return RetrainResult(status="skipped", slot=limit_name(config), held_by=holder)
        import_dropped(config)  # labelled files in the watch folder -> batches or quarantine
        batches = find_batches(config)
        champion = champion_version(config)
        if control:
            if config.retrain.rm_data != "cumulative":
                raise ConfigError("retrain --control needs retrain.rm_data: cumulative (the "
                                  "earlier batches are its data)")
            if champion is None:
                raise RegistryError(f"retrain --control: '{config.tracking.registered_policy}'"
                                    " has no champion to compare with")
            rename_flow_run(f"retrain-{config.tracking.registered_policy}-"
                            f"v{champion.version}-control")
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
        announce_outcome(config.tracking.registered_policy, result.status,
                         result.decision and result.decision.reason,
                         result.run and result.run.parent_run_id)
        if result.run is not None:
            reason = result.decision.reason if result.decision else ""
            publish_summary(result.run, f"{result.run.run_name}: {result.status}", awaiting_text(
                config, result) or f"Retrain {result.status}" + (f": {reason}" if reason
                                                                  else "."))
    if result.status == "awaiting approval":
        return ask_for_approval(config, result)  # served: the process ends here until answered
    return result


@flow(name="compare", flow_run_name="compare", log_prints=True)
def compare(config: PipelineConfig, champion: str = "1",
            challenger: str = "champion") -> CompareResult:
    """Two registered policy versions (numbers or aliases) through the retrain's gate: both
    answer the gate's held-out prompts, one scorer scores both, the paired bootstrap test
    decides; nothing trained, no alias moved (e.g. the champion against the first one).
    Recorded as ``rlhf.compare.*`` tags (no gate decision); one version named twice (e.g.
    ``1`` when the champion is v1) is refused."""
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
