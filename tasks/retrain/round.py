"""A retrain round's decisions (slot, settings, starting models, lineage, refusals, reports, the
outcome's event), kept out of the retrain flow that wires them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from data_checks.validate import ValidationFailed
from tasks.config.pipeline_config import ConfigError, PipelineConfig
from tasks.pipeline.prepare import Prepared
from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.platform.mlflow.registry import RegistryError
from tasks.platform.mlflow.runs import resolved_store
from tasks.platform.mlflow.tags import (
    ANCESTRY_TAG,
    BATCH_SOURCES_TAG,
    CHAMPION_VERSION_TAG,
    GATE_SCORER_TAG,
    LINEAGE_BATCHES_TAG,
    SFT_RUN_TAG,
    STARTED_FROM_TAG,
    TRAINED_ON_TAG,
)
from tasks.platform.prefect.events import KEPT, OUTCOME_LABEL, POLICY_RESOURCE, PROMOTED, emit
from tasks.platform.prefect.prefect_api import one_slot, report
from tasks.retrain.gate.champion import Champion
from tasks.retrain.labels.imports import quarantine_batches
from tasks.retrain.records import Batch

OUTCOME = "rlhf-retrain-decision"  # the Prefect artifact key of each round's outcome
TRAINED = ("bootstrapped", "promoted", "kept")  # the retrain outcomes that trained a policy


def limit_name(config: PipelineConfig) -> str:
    """``rlhf-retrain-<policy>-<store hash>``: one slot per store and policy, so two stores
    never block each other while retrains of one store never race."""
    store = resolved_store(default_tracking_uri(config.tracking.tracking_uri))
    return f"rlhf-retrain-{config.tracking.registered_policy}-" \
        f"{hashlib.sha256(store.encode()).hexdigest()[:8]}"


def retrain_slot(config: PipelineConfig) -> AbstractContextManager[bool]:
    """Hold the retrain slot while the body runs -> True; False when held elsewhere and
    ``retrain.on_overlap`` is skip."""
    return one_slot(limit_name(config), skip=config.retrain.on_overlap == "skip")


def retrain_run_name(policy: str, champion: str | None, digests: list[str]) -> str:
    """``retrain-<policy>-v3-1a2b3c4d+2``: the champion started from (or ``bootstrap``), the
    first new batch's digest and how many more (or ``-nothing-new``)."""
    start = f"v{champion}" if champion else "bootstrap"
    batches = f"-{digests[0][:8]}" + (f"+{len(digests) - 1}" if len(digests) > 1 else "") \
        if digests else ("-nothing-new" if champion else "")  # a bootstrap trains anyway
    return f"retrain-{policy}-{start}{batches}"


def control_run_name(config: PipelineConfig, champion_version: str | None) -> str:
    """A control round's flow-run name; ConfigError or RegistryError when it cannot run."""
    policy = config.tracking.registered_policy
    if config.retrain.rm_data != "cumulative":
        raise ConfigError("retrain --control needs retrain.rm_data: cumulative (the "
                          "earlier batches are its data)")
    if champion_version is None:
        raise RegistryError(f"retrain --control: '{policy}' has no champion to compare with")
    return f"retrain-{policy}-v{champion_version}-control"


def round_settings(config: PipelineConfig) -> PipelineConfig:
    """The config with the retrain's PPO iterations (default a third: the champion had them
    all) and reward-model epochs."""
    r = config.retrain
    iterations = r.ppo_iterations or max(1, round(config.ppo.iterations / 3))
    update = {"ppo": config.ppo.model_copy(update={"iterations": iterations})}
    if r.rm_epochs is not None:
        update["reward"] = config.reward.model_copy(update={"epochs": r.rm_epochs})
    return config.model_copy(update=update)


def round_start(config: PipelineConfig, champion: Champion) -> tuple[str, str, str]:
    """The model folders a challenge starts from: (policy, reference, reward model) by
    ``retrain.policy_init``, ``reference`` and ``rm_init``."""
    r = config.retrain
    return (champion.policy_dir if r.policy_init == "champion" else champion.sft_dir,
            champion.sft_dir if r.reference == "sft" else champion.policy_dir,
            champion.sft_dir if r.rm_init == "sft" else champion.rm_dir)


def lineage_tags(prep: Prepared, batches: list[Batch], champion: Champion | None = None,
                 scorer: str | None = None) -> dict[str, str]:
    """The registered version's lineage tags: batches, ancestry and, for a challenger, the
    champion, SFT run and gate scorer."""
    tags = {LINEAGE_BATCHES_TAG: json.dumps([b.digest for b in batches]),
            TRAINED_ON_TAG: json.dumps(prep.trained_on),
            BATCH_SOURCES_TAG: json.dumps(prep.batch_sources),
            ANCESTRY_TAG: champion.ancestry if champion else "",
            STARTED_FROM_TAG: f"champion v{champion.version}" if champion else "none"}
    if champion is not None:
        tags.update({CHAMPION_VERSION_TAG: champion.version, SFT_RUN_TAG: champion.sft_run_id,
                     GATE_SCORER_TAG: scorer or ""})
    return tags


@contextmanager
def named_batch_rows(rows: list[dict]) -> Iterator[None]:
    """A validation failure names the batch files of its rows, not only combined rows."""
    try:
        yield
    except ValidationFailed as err:
        note = "; ".join(f"{r['first']}-{r['last']} = {r['name']} rows "
                         f"1-{r['last'] - r['first'] + 1}" for r in rows)
        raise ValidationFailed(
            f"{err}\nrows of the combined preference file by batch: {note}") from None


@contextmanager
def refused_batches(config: PipelineConfig, batches: list[Batch], first: bool) -> Iterator[None]:
    """Quarantine new batches that fail validation in a challenge (the configured data passed
    before); in a bootstrap (``first``) the data may be at fault, so nothing moves."""
    try:
        yield
    except ValidationFailed as err:
        if first:
            raise
        moved = quarantine_batches(config, batches, str(err).splitlines()[0])
        raise ValidationFailed(
            f"{err}\nquarantined: {', '.join(moved)} (next: fix the rows named above and "
            f"drop the file into {config.retrain.watch_dir} again, or make a new batch)"
        ) from None


def report_skipped(config: PipelineConfig, holder: str) -> None:
    report(OUTCOME, "# Retrain skipped: another retrain of this store is running\n\n"
           f"`retrain.on_overlap` is skip; the slot `{limit_name(config)}` is held by "
           f"{holder}.\n\nNext: nothing to do, the running round consumes the new batches; "
           "to queue rounds instead, set `retrain.on_overlap: wait`.\n", "retrain outcome")


def report_nothing_new(config: PipelineConfig, consumed: int) -> None:
    """Nothing trained, and how a preference batch is made (the retrain consumes batches only)."""
    watch = config.retrain.watch_dir
    report(OUTCOME, f"# Retrain: nothing new\n\nNo new batch in `{watch}` ({consumed} consumed);"
           " nothing trained, champion unchanged.\n\n"
           "Next: make a preference batch, then run the retrain again:\n"
           "- collect responses to label: the `collect` deployment (Quick run) or "
           "`rlhf collect`;\n"
           "- labels from Label Studio: the `label-pull` deployment or `rlhf label pull`; "
           f"a labelled file: `rlhf label import FILE` or drop it into `{watch}`;\n"
           "- on the demo: `rlhf demo-batch` (collects from the champion and labels with the "
           "demo's judge).\n", "retrain outcome")


def report_first_champion(batches: int, parent_run_id: str) -> None:
    report(OUTCOME, f"# Retrain: first champion\n\nNo champion existed: the whole pipeline "
           f"ran on the data and {batches} batch(es); its policy is champion.\n\nMLflow "
           f"parent run: `{parent_run_id}`\n", "retrain outcome")


def announce_outcome(policy: str, status: str, reason: str | None = None,
                     parent_run_id: str | None = None) -> None:
    """Emit promoted or kept for a retrain round that trained; nothing for any other."""
    if status not in TRAINED:
        return
    payload = {k: v for k, v in (("reason", reason), ("parent_run_id", parent_run_id)) if v}
    emit(KEPT if status == "kept" else PROMOTED, POLICY_RESOURCE + policy, policy,
         {OUTCOME_LABEL: status}, payload)
