"""The retrain flow: new preference batches (+ every consumed one, ``rm_data: cumulative``)
-> validate -> [judge split -> judge reward model, when the gate's scorer is judge_model] ->
reward model -> PPO from the champion -> gate against the champion -> register (champion
moves only on a win; the version records its ancestry and the batches it was trained on).

No new batch: nothing trains, the run ends in seconds. No champion yet: the whole pipeline
runs on the data plus the batches and its result becomes champion. One retrain at a time
(a Prefect global concurrency limit); a run that finds one running skips or waits.

No ``from __future__ import annotations`` (Prefect reads the signature's classes).
"""

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager

from prefect import flow

from data_checks.validate import ValidationFailed
from flows.deployment import served_config
from flows.wiring import run_pipeline, tracked, train_policy
from tasks.champion.batches import (
    add_batches,
    batch_rows_note,
    fetch_champion,
    find_batches,
    mark_consumed,
    report,
)
from tasks.champion.scorers import batch_pair_keys, resolve_scorer
from tasks.config import PipelineConfig
from tasks.configfile import ConfigError
from tasks.finish import finish
from tasks.prepare import Prepared, prepare
from tasks.runtime.prefect_api import one_slot, slot_holder
from tasks.stages.gate import gate
from tasks.stages.judge_model import judge_model, judge_split
from tasks.stages.records import Artifact, DataRecord, ModelRecord, PolicyRecord
from tasks.stages.register import register
from tasks.stages.validate import validate
from tasks.tracking.registry import RegistryError
from tasks.tracking.runs import RunContext, default_tracking_uri, resolved_store
from tasks.tracking.tags import (
    ANCESTRY_TAG,
    BATCH_SOURCES_TAG,
    CHAMPION_VERSION_TAG,
    GATE_SCORER_TAG,
    LINEAGE_BATCHES_TAG,
    SFT_RUN_TAG,
    STARTED_FROM_TAG,
    TRAINED_ON_TAG,
)


def limit_name(config: PipelineConfig) -> str:
    """``rlhf-retrain-<policy>-<8 hex>``: the slot is one per tracking store and policy (the
    hex: sha256 of the resolved store URI), so retrains of two stores never block each other
    while two of one store, from any machine, still never race."""
    store = resolved_store(default_tracking_uri(config.tracking.tracking_uri))
    return f"rlhf-retrain-{config.tracking.registered_policy}-" \
        f"{hashlib.sha256(store.encode()).hexdigest()[:8]}"


@contextmanager
def retrain_slot(config: PipelineConfig) -> Iterator[bool]:
    """Hold the retrain slot while the body runs -> True; False when another retrain holds
    it and ``retrain.on_overlap`` is skip (wait: block until it is free)."""
    with one_slot(limit_name(config), skip=config.retrain.on_overlap == "skip") as held:
        yield held


def _retrain_settings(config: PipelineConfig) -> PipelineConfig:
    """``retrain.ppo_iterations`` (None: a third of ppo.iterations, the champion already had
    them all) / ``retrain.rm_epochs`` over ppo.iterations / reward.epochs."""
    r = config.retrain
    iterations = r.ppo_iterations or max(1, round(config.ppo.iterations / 3))
    update = {"ppo": config.ppo.model_copy(update={"iterations": iterations})}
    if r.rm_epochs is not None:
        update["reward"] = config.reward.model_copy(update={"epochs": r.rm_epochs})
    return config.model_copy(update=update)


def _lineage(prep: Prepared, batches: list[dict], ancestry: str, started_from: str) -> dict:
    return {LINEAGE_BATCHES_TAG: json.dumps([b["digest"] for b in batches]),
            TRAINED_ON_TAG: json.dumps(prep.trained_on),
            BATCH_SOURCES_TAG: json.dumps(prep.batch_sources),
            ANCESTRY_TAG: ancestry, STARTED_FROM_TAG: started_from}


def bootstrap(config: PipelineConfig, batches: list[dict]) -> dict:
    """No champion yet: the whole pipeline on the data + batches; its result is champion.
    With the judge_model scorer, the judge's held-out pairs are kept from the reward model
    here already, so later challengers' judges share no pair with any RM before them."""
    rows: list[dict] = []
    lineage: dict = {}
    judge: dict = {}  # the run's resolved gold judge, known once prepared

    def with_batches(ctx: RunContext, prep: Prepared) -> Prepared:
        out = add_batches(ctx, config, prep, batches)
        rows.extend(out.batch_rows)
        lineage.update(_lineage(out, batches, "", "none"))
        judge["name"] = out.judge
        return out

    def split(ctx: RunContext, data: DataRecord) -> DataRecord:
        if resolve_scorer(config, judge["name"]) != "judge_model":
            return data  # a gold judge scores the gate: every pair trains the RM
        return judge_split(ctx, config, data)

    try:
        result = run_pipeline(config, prep_hook=with_batches, lineage=lineage,
                              data_hook=split)
    except ValidationFailed as err:  # name the batch files, not only combined rows
        raise ValidationFailed(f"{err}\n{batch_rows_note(rows)}") from None
    ctx = RunContext(tracking_uri=result["tracking_uri"], experiment_id=result["experiment_id"],
                     parent_run_id=result["parent_run_id"], workdir=result["workdir"],
                     seed=config.seed)
    mark_consumed(ctx, batches)
    report("rlhf-retrain-decision", f"# Retrain: first champion\n\nNo champion existed: the "
           f"whole pipeline ran on the data and {len(batches)} batch(es); its policy is "
           f"champion.\n\nMLflow parent run: `{ctx.parent_run_id}`\n", "retrain outcome")
    return {"status": "bootstrapped", **result}


def challenge(config: PipelineConfig, batches: list[dict],
              consumed: list[dict] | None = None, control: bool = False) -> dict:
    """Retrain from the champion on the new batches (and, ``rm_data: cumulative``, every
    batch consumed before); the gate decides on promotion. ``control``: the same round on
    the consumed batches alone, gated and recorded, but nothing registered or consumed.
    The run is prepared (and its params recorded) with the settings it trains with
    (``retrain.ppo_iterations``, ``retrain.rm_epochs``), not the first run's."""
    config = _retrain_settings(config)
    prep = prepare(config)
    ctx = prep.ctx
    with tracked(ctx, config):
        champion = fetch_champion(ctx, config)
        prep = add_batches(ctx, config, prep, batches, champion, consumed)
        try:
            data = validate(ctx, config, prep)
        except ValidationFailed as err:  # name the batch files, not only combined rows
            raise ValidationFailed(f"{err}\n{batch_rows_note(prep.batch_rows)}") from None
        r = config.retrain
        reference = champion.sft_dir if r.reference == "sft" else champion.policy_dir
        rm_init = champion.sft_dir if r.rm_init == "sft" else champion.rm_dir
        rm_data, judge_out = data, None
        if resolve_scorer(config, prep.judge) == "judge_model":
            rm_data = judge_split(ctx, config, data, batch_pair_keys(prep))
            judge_out = judge_model(ctx, config, rm_data, champion.sft_dir)
        start = champion.policy_dir if r.policy_init == "champion" else champion.sft_dir
        trained = train_policy(ctx, config, prep, rm_data,
                               ModelRecord(model=Artifact(path=start)), rm_init_dir=rm_init,
                               reference_dir=reference)
        gate_out = gate(ctx, config, prep, data, champion, trained["ppo"],
                        trained["reward_model"], reference, judge_out)
        if control:
            result = finish(ctx, {"validate": data, **trained, "gate": gate_out})
            return {"status": "control", "reason": gate_out.decision.reason,
                    "scorer": gate_out.decision.scorer, **result}
        lineage = {**_lineage(prep, batches, champion.ancestry,
                              f"champion v{champion.version}"),
                   CHAMPION_VERSION_TAG: champion.version,
                   SFT_RUN_TAG: champion.sft_run_id,
                   GATE_SCORER_TAG: gate_out.decision.scorer}
        reg = register(ctx, config, trained["ppo"], gate_out, trained["reward_model"], data,
                       lineage=lineage, decision=gate_out.decision)
        mark_consumed(ctx, batches)
    result = finish(ctx, {"validate": data, **trained, "gate": gate_out, "register": reg})
    return {"status": "promoted" if gate_out.decision.promote else "kept",
            "reason": gate_out.decision.reason,
            "scorer": gate_out.decision.scorer, **result}


@flow(name="retrain", flow_run_name="retrain", log_prints=True)
def retrain(config: PipelineConfig, control: bool = False) -> dict:
    """Consume new preference batches from ``retrain.watch_dir``: retrain from the champion
    and promote the challenger only when the gate says so.

    Args:
        config: The served pipeline config; its ``retrain`` section sets the watched
            folder, the schedule, the data/initialisation choices and the gate.
        control: A control round: the same retrain on the batches consumed so far (new
            ones stay new), gated against the champion and recorded; nothing registered,
            no alias moved. It shows what a round's new labels add.
    """
    from tasks.champion.batches import champion_version
    from tasks.champion.events import announce_outcome, rename_flow_run, retrain_run_name
    from tasks.champion.labels import import_dropped, quarantine_batches

    config = served_config(config)  # a custom run's fields over the served config
    with retrain_slot(config) as acquired:
        if not acquired:
            holder = slot_holder(limit_name(config))
            report("rlhf-retrain-decision", "# Retrain skipped: another retrain of this store "
                   f"is running\n\n`retrain.on_overlap` is skip; the slot "
                   f"`{limit_name(config)}` is held by {holder}.\n", "retrain outcome")
            return {"status": "skipped", "slot": limit_name(config), "held_by": holder}
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
            return challenge(config, [], batches["consumed"], control=True)
        rename_flow_run(retrain_run_name(config.tracking.registered_policy,
                                         champion and str(champion.version),
                                         [b["digest"] for b in batches["new"]]))
        if champion is not None and not batches["new"]:
            report("rlhf-retrain-decision", f"# Retrain: nothing new\n\nNo new batch in "
                   f"`{config.retrain.watch_dir}` ({len(batches['consumed'])} consumed); "
                   "nothing trained, champion unchanged.\n", "retrain outcome")
            return {"status": "nothing new", "consumed": len(batches["consumed"])}
        try:
            result = bootstrap(config, batches["new"]) if champion is None else \
                challenge(config, batches["new"], batches["consumed"])
        except ValidationFailed as err:
            if champion is None:  # the configured data may be at fault, not the batches
                raise
            # the configured data passed before: the new batches are refused, out of the
            # watch folder, so that later rounds go on with later batches
            moved = quarantine_batches(config, batches["new"], str(err).splitlines()[0])
            raise ValidationFailed(f"{err}\nquarantined: {', '.join(moved)}") from None
        announce_outcome(config.tracking.registered_policy, result)
        return result


@flow(name="compare", flow_run_name="compare", log_prints=True)
def compare(config: PipelineConfig, champion: str = "1", challenger: str = "champion") -> dict:
    """Two registered policy versions (numbers or aliases) through the retrain's gate: both
    answer the gate's held-out prompts, one scorer scores both, the paired bootstrap test
    decides; nothing trained, no alias moved (e.g. the champion against the first one).
    Recorded as ``rlhf.compare.*`` tags (no gate decision); one version named twice (e.g.
    ``1`` when the champion is v1) is refused."""
    from tasks.champion.events import rename_flow_run

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
    result = finish(ctx, {"validate": data, "gate": gate_out})
    return {"status": "compared", "reason": gate_out.decision.reason,
            "scorer": gate_out.decision.scorer,
            "versions": (base.version, other.version), **result}
