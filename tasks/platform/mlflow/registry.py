"""The policy's registry aliases and the moves between them, each logged on the registered
model (``rlhf.alias_log``) and on the new champion, so who moved what and why stays visible."""

from __future__ import annotations

import getpass
import json
import time
from pathlib import Path

from mlflow.entities import LoggedModelOutput
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tasks.platform.mlflow.errors import RegistryError
from tasks.platform.mlflow.runs import retry_unique_key
from tasks.platform.mlflow.tags import (
    ALIAS_LOG_TAG,
    BASE_MODEL_TAG,
    CHAMPION_SINCE_TAG,
    HEALTH_FLAGS_TAG,
    HEALTH_STOPPED_TAG,
    PARENT_TAG,
    REGISTER_DECISION_TAG,
    REGISTER_REASON_TAG,
    STAGE_TAG,
    TAX_OVER_TAG,
    stage_run_tag,
)

CHAMPION, PREVIOUS, CHALLENGER = "champion", "previous-champion", "challenger"
CANDIDATE = "candidate"


def set_alias(client: MlflowClient, name: str, alias: str, version) -> None:
    """Point ``alias`` at ``version``, retried on the unique key that concurrent moves can hit."""
    retry_unique_key(lambda: client.set_registered_model_alias(name, alias, str(version)))


def alias_version(client: MlflowClient, name: str, alias: str):
    """The model version holding ``alias``, or None (no model, no alias)."""
    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def model_version(client: MlflowClient, name: str, version: str | int):
    """The registered version ``version`` of ``name``, or None (no such model or version)."""
    try:
        return client.get_model_version(name, str(version))
    except MlflowException:
        return None


def move_champion(client: MlflowClient, name: str, version: str | int, action: str,
                  reason: str) -> str | None:
    """Make ``version`` champion, the old one ``previous-champion`` -> the old version (or
    None). A ``challenger`` alias on ``version`` is removed."""
    version = str(version)
    old = alias_version(client, name, CHAMPION)
    before = None if old is None else str(old.version)  # MLflow 3 gives an int
    if before is not None and before != version:
        set_alias(client, name, PREVIOUS, before)
    set_alias(client, name, CHAMPION, version)
    challenger = alias_version(client, name, CHALLENGER)
    cleared = challenger is not None and str(challenger.version) == version
    if cleared:
        client.delete_registered_model_alias(name, CHALLENGER)
    client.set_model_version_tag(name, version, CHAMPION_SINCE_TAG, f"{action}: {reason}")
    log = client.get_registered_model(name).tags.get(ALIAS_LOG_TAG, "")
    lines = [x for x in log.splitlines() if x][-19:]  # with this one, the last 20 moves
    entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "user": getpass.getuser(), "action": action, "champion": version, "before": before,
             "reason": reason, **({"challenger": "removed"} if cleared else {})}
    client.set_registered_model_tag(name, ALIAS_LOG_TAG, "\n".join([*lines, json.dumps(entry)]))
    return before


def promote(tracking_uri: str, name: str, version: str | int, reason: str,
            flagged: bool = False) -> str | None:
    """`rlhf promote`: make ``version`` champion; a version PPO's health stopped or flagged
    for reward hacking, or over its alignment-tax budget, needs ``flagged``."""
    client = MlflowClient(tracking_uri)
    found = model_version(client, name, version)
    if found is None:
        raise RegistryError(f"registered model '{name}' has no version {version}")
    hacking = "reward_hacking" in found.tags.get(HEALTH_FLAGS_TAG, "").split(",")
    why = found.tags.get(HEALTH_STOPPED_TAG) or (
        "PPO's reward_hacking detector fired" if hacking else found.tags.get(TAX_OVER_TAG))
    if why and not flagged:
        raise RegistryError(f"'{name}' v{version} was not promoted: {why}; to make it "
                            f"champion anyway: rlhf promote {version} --flagged")
    if why:
        reason = f"{reason} (flagged: {why})"
    return move_champion(client, name, version, "promote", reason)


def rollback(tracking_uri: str, name: str, reason: str) -> tuple[str, str]:
    """`rlhf rollback`: swap ``champion`` and ``previous-champion`` -> (from, to)."""
    client = MlflowClient(tracking_uri)
    previous = alias_version(client, name, PREVIOUS)
    current = alias_version(client, name, CHAMPION)
    if previous is None or current is None:
        raise RegistryError(f"'{name}' has no champion and previous-champion to roll back")
    move_champion(client, name, previous.version, "rollback", reason)
    return str(current.version), str(previous.version)


def set_version_tags(client: MlflowClient, name: str, version: str | int,
                     tags: dict[str, str]) -> None:
    for tag, value in tags.items():
        client.set_model_version_tag(name, str(version), tag, value)


def show_on_run(client: MlflowClient, run_id: str, versions: list[tuple[str, str | int]]) -> None:
    """List ``versions`` in ``run_id``'s "Registered models" panel by adding their logged
    models to the run's outputs (each version keeps the register run that logged it)."""
    ids = [_logged_model_id(client.get_model_version(name, str(version)))
           for name, version in versions]
    run_outputs = client.get_run(run_id).outputs
    listed = {o.model_id for o in (run_outputs.model_outputs if run_outputs else [])}
    # a resumed register stage finds them listed already, and the store refuses a repeat
    outputs = [LoggedModelOutput(model_id=i, step=0) for i in ids if i and i not in listed]
    if outputs:
        client.log_outputs(run_id, outputs)


def _logged_model_id(version) -> str | None:
    """The version's ``model_id``, else read from its ``models:/`` source (SQLite stores)."""
    if getattr(version, "model_id", None):
        return version.model_id
    source = version.source or ""
    return source.removeprefix("models:/") if source.startswith("models:/m-") else None


def version_parent_run(client: MlflowClient, version):
    """The parent run of a version's register run (that run itself when it has none)."""
    run = client.get_run(version.run_id)
    return client.get_run(run.data.tags.get(PARENT_TAG, version.run_id))


# a stage's checkpoint in its run, and the folder under a download's root it goes to
CHECKPOINTS = {"ppo": ("checkpoint/policy", "."), "reward_model": ("checkpoint", "rm"),
               "sft": ("checkpoint", "sft")}


def download_policy(client: MlflowClient, version, root: Path,
                    stages: tuple[str, ...] = ("ppo", "reward_model")) -> dict[str, tuple]:
    """A version's checkpoints downloaded under ``root`` -> stage: (its run, its local folder)."""
    runs = {}
    for stage in stages:  # the version's lineage tag, else its register run's sibling
        runs[stage] = version.tags.get(stage_run_tag(stage))
        if not runs[stage]:
            parent = client.get_run(version.run_id).data.tags[PARENT_TAG]
            found = client.search_runs([client.get_run(parent).info.experiment_id], max_results=1,
                                       filter_string=f"tags.`{PARENT_TAG}` = '{parent}' and "
                                                     f"tags.`{STAGE_TAG}` = '{stage}'")
            if not found:
                raise FileNotFoundError(f"champion v{version.version}: no {stage} run in its "
                                        "lineage")
            runs[stage] = found[0].info.run_id
    return {stage: (run, client.download_artifacts(run, CHECKPOINTS[stage][0],
                                                   str(root / CHECKPOINTS[stage][1])))
            for stage, run in runs.items()}


def registered_base(tracking_uri: str, name: str) -> tuple[str, str] | None:
    """(version, base model) of the newest version of ``name`` that records one, or None."""
    try:
        found = MlflowClient(tracking_uri).search_model_versions(f"name = '{name}'")
    except MlflowException:  # no such registered model yet
        return None
    based = [v for v in found if (v.tags or {}).get(BASE_MODEL_TAG)]
    if not based:
        return None
    newest = max(based, key=lambda v: int(v.version))
    return str(newest.version), newest.tags[BASE_MODEL_TAG]


def earlier_registration(client: MlflowClient, names: tuple[str, ...],
                         run_id: str) -> tuple[str, ...] | None:
    """Adopt what a crashed attempt of register run ``run_id`` left: the version numbers when
    every model of ``names`` has one, else delete the partial versions and return None, so
    each run keeps one version per model."""
    found = {}
    for name in names:  # each model's versions from the run, newest first
        try:
            versions = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
        except MlflowException:  # no such registered model yet
            versions = []
        found[name] = sorted(versions, key=lambda v: int(v.version), reverse=True)
    complete = all(found.values())
    drop = [v for versions in found.values() for v in (versions[1:] if complete else versions)]
    for version in drop:
        client.delete_model_version(version.name, str(version.version))
    return tuple(str(found[name][0].version) for name in names) if complete else None


def moved_to(client: MlflowClient, name: str, version: str) -> tuple[str, str] | None:
    """(decision, reason) when ``version`` already holds ``champion`` with its move recorded,
    so a resume does not move it again; else None."""
    holder = alias_version(client, name, CHAMPION)
    if holder is None or str(holder.version) != str(version) \
            or CHAMPION_SINCE_TAG not in holder.tags:
        return None
    return (holder.tags.get(REGISTER_DECISION_TAG, "promote"),
            holder.tags.get(REGISTER_REASON_TAG, "promoted before the resume"))
