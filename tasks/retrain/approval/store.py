"""A retrain candidate's sign-off as MLflow keeps it (``retrain.approval: required``).

A waiting version holds the alias ``candidate`` and pending tags. The answer is written once,
as a param on the round's parent run: MLflow refuses to change a param, so of two answers at
once exactly one is kept.
"""

from __future__ import annotations

import calendar
import tempfile
import time
from contextlib import suppress
from typing import Literal

import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from pydantic import BaseModel, ConfigDict, Field

from tasks.platform.mlflow import registry
from tasks.platform.mlflow.runs import set_tags
from tasks.platform.mlflow.tags import (
    APPROVAL_ANSWER_PARAM,
    APPROVAL_AT_TAG,
    APPROVAL_BY_TAG,
    APPROVAL_DEADLINE_TAG,
    APPROVAL_FLOW_RUN_TAG,
    APPROVAL_REASON_TAG,
    APPROVAL_STATUS_TAG,
    APPROVAL_VERSION_TAG,
    APPROVAL_VIA_TAG,
    CHAMPION_VERSION_TAG,
    GATE_GOLD_PREFIX,
    GATE_PREFIX,
    GATE_REASON_TAG,
    GATE_SCORER_TAG,
    GATE_TAG,
    HEALTH_FLAGS_TAG,
    PARENT_TAG,
    PIPELINE_RUN_TAG,
    STAGE_TAG,
)

PENDING = "pending"
STATUS = {"approve": "approved", "reject": "rejected", "timeout": "timed-out"}  # after an answer
REASON_CHARS = 2000  # a reason longer than this is cut (the param holds 6000 characters)


def utc_now(after_h: float = 0.0) -> str:
    """Now (or ``after_h`` hours on) in ISO 8601 UTC to the second, as every approval time."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + after_h * 3600))


def utc_seconds(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


class Answer(BaseModel):
    """One answer to a candidate: the decision, who gave it, through what, when, and why."""

    model_config = ConfigDict(frozen=True)
    decision: Literal["approve", "reject", "timeout"]
    reason: str = Field(max_length=REASON_CHARS)
    by: str
    via: Literal["prefect-ui", "cli", "timeout"]
    at: str = Field(default_factory=utc_now)


class Candidate(BaseModel):
    """A registered version a round asked a person about, and the answer kept (None: none)."""

    model_config = ConfigDict(frozen=True)
    name: str
    version: str
    parent_run_id: str
    experiment_id: str
    gated_against: str | None  # the champion's version the gate compared it with
    deadline: str
    status: str  # pending, approved, rejected or timed-out
    gate_reason: str
    flow_run_id: str | None = None  # the Prefect flow run waiting for the answer (served)
    answer: Answer | None = None

    @property
    def overdue(self) -> bool:
        return utc_seconds(self.deadline) <= time.time()


def _candidate(client: MlflowClient, version) -> Candidate:
    tags = version.tags
    run = client.get_run(tags[PIPELINE_RUN_TAG])
    kept = run.data.params.get(APPROVAL_ANSWER_PARAM)
    return Candidate(
        name=version.name, version=str(version.version), parent_run_id=run.info.run_id,
        experiment_id=run.info.experiment_id, gated_against=tags.get(CHAMPION_VERSION_TAG),
        deadline=tags[APPROVAL_DEADLINE_TAG], status=tags[APPROVAL_STATUS_TAG],
        gate_reason=tags.get(GATE_TAG, ""), flow_run_id=tags.get(APPROVAL_FLOW_RUN_TAG),
        answer=Answer.model_validate_json(kept) if kept else None)


def candidate(client: MlflowClient, name: str, version: str | int) -> Candidate | None:
    """``name`` v``version`` as a candidate (None: no such version, or it never waited)."""
    found = registry.model_version(client, name, version)
    if found is None or APPROVAL_STATUS_TAG not in found.tags:
        return None
    return _candidate(client, found)


def waiting_candidates(client: MlflowClient, name: str) -> list[Candidate]:
    """The versions of ``name`` waiting for an answer (status pending), oldest first."""
    try:
        found = client.search_model_versions(
            f"name = '{name}' and tags.`{APPROVAL_STATUS_TAG}` = '{PENDING}'")
    except MlflowException:  # no such registered model yet
        return []
    return [_candidate(client, v) for v in sorted(found, key=lambda v: int(v.version))]


def mark_waiting(client: MlflowClient, name: str, version: str | int, parent_run_id: str,
                 deadline: str) -> None:
    """Tag the version and its round's run as waiting, and give it ``candidate``."""
    tags = {APPROVAL_STATUS_TAG: PENDING, APPROVAL_DEADLINE_TAG: deadline}
    registry.set_version_tags(client, name, version, tags)
    set_tags(client, parent_run_id, {**tags, APPROVAL_VERSION_TAG: str(version)})
    registry.set_alias(client, name, registry.CANDIDATE, version)


def note_flow_run(client: MlflowClient, cand: Candidate, flow_run_id: str) -> None:
    """The Prefect flow run that waits for the answer (a served round)."""
    registry.set_version_tags(client, cand.name, cand.version, {APPROVAL_FLOW_RUN_TAG: flow_run_id})
    set_tags(client, cand.parent_run_id, {APPROVAL_FLOW_RUN_TAG: flow_run_id})


def claim_answer(client: MlflowClient, cand: Candidate, answer: Answer) -> Answer:
    """Keep ``answer`` unless one is kept already -> the kept answer."""
    try:
        client.log_param(cand.parent_run_id, APPROVAL_ANSWER_PARAM, answer.model_dump_json())
        return answer
    except MlflowException:
        kept = client.get_run(cand.parent_run_id).data.params.get(APPROVAL_ANSWER_PARAM)
        if kept is None:  # refused for another reason (a permission): say so
            raise
        return Answer.model_validate_json(kept)


def record_decided(client: MlflowClient, cand: Candidate, answer: Answer) -> None:
    """Tag the answer on the version and its run, the status last (it marks it carried out)."""
    tags = {APPROVAL_BY_TAG: answer.by, APPROVAL_AT_TAG: answer.at,
            APPROVAL_REASON_TAG: answer.reason, APPROVAL_VIA_TAG: answer.via}
    done = {APPROVAL_STATUS_TAG: STATUS[answer.decision]}
    set_tags(client, cand.parent_run_id, {**tags, **done})
    registry.set_version_tags(client, cand.name, cand.version, tags)
    registry.set_version_tags(client, cand.name, cand.version, done)


def release_candidate_alias(client: MlflowClient, name: str, version: str | int) -> None:
    """Move ``candidate`` off ``version`` to the newest other waiting one, else remove it."""
    holder = registry.alias_version(client, name, registry.CANDIDATE)
    if holder is None or str(holder.version) != str(version):
        return
    others = [c for c in waiting_candidates(client, name) if c.version != str(version)]
    if others:
        registry.set_alias(client, name, registry.CANDIDATE, others[-1].version)
    else:
        client.delete_registered_model_alias(name, registry.CANDIDATE)


class RoundEvidence(BaseModel):
    """What a person reads before answering, from the round's run and its gate run."""

    model_config = ConfigDict(frozen=True)
    figures: dict[str, str]
    scorer: str
    reason: str
    gold: dict[str, str]
    health_flags: list[str]
    side_by_side: list[dict]
    n_side_by_side: int  # rows in the whole table
    confidence: str  # the interval's level (retrain.gate.confidence)
    max_kl: str  # the gate's KL cap (retrain.gate.max_kl)
    round_run_id: str
    champion_run_id: str | None


def round_evidence(client: MlflowClient, cand: Candidate, table_file: str) -> RoundEvidence:
    """The evidence of ``cand``'s round, with the first 4 rows of ``table_file``."""
    run = client.get_run(cand.parent_run_id)
    tags = run.data.tags
    figures = {k.removeprefix(GATE_PREFIX): v for k, v in tags.items()
               if k.startswith(GATE_PREFIX) and "." not in k.removeprefix(GATE_PREFIX)}
    gold = {k.removeprefix(GATE_GOLD_PREFIX): v for k, v in tags.items()
            if k.startswith(GATE_GOLD_PREFIX)}
    gate_runs = client.search_runs([cand.experiment_id], max_results=1, filter_string=(
        f"tags.`{PARENT_TAG}` = '{cand.parent_run_id}' and tags.`{STAGE_TAG}` = 'gate'"))
    table: list[dict] = []
    if gate_runs:  # OSError, ValueError: a gate run from before the table was kept
        with tempfile.TemporaryDirectory() as tmp, suppress(OSError, ValueError):
            path = client.download_artifacts(gate_runs[0].info.run_id, table_file, tmp)
            table = pd.read_json(path, orient="split").to_dict("records")
    champion = registry.model_version(client, cand.name, cand.gated_against) \
        if cand.gated_against else None
    flags = [f.strip() for f in tags.get(HEALTH_FLAGS_TAG, "").split(",") if f.strip()]
    return RoundEvidence(
        figures=figures, scorer=tags.get(GATE_SCORER_TAG, "?"),
        reason=tags.get(GATE_REASON_TAG, cand.gate_reason), gold=gold, health_flags=flags,
        side_by_side=table[:4], n_side_by_side=len(table),
        confidence=run.data.params.get("retrain.gate.confidence", "0.95"),
        max_kl=run.data.params.get("retrain.gate.max_kl", "?"),
        round_run_id=cand.parent_run_id, champion_run_id=registry.version_parent_run(
            client, champion).info.run_id if champion else None)
