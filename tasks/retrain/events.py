"""The retrain loop's announcements as Prefect events: a round's outcome, and each step of a
person's sign-off."""

from __future__ import annotations

from typing import Any

from tasks.platform.prefect.events import (
    KEPT,
    OUTCOME_LABEL,
    POLICY_RESOURCE,
    POLICY_VERSION_LABEL,
    PROMOTED,
    emit,
)

TRAINED = ("bootstrapped", "promoted", "kept")  # the retrain outcomes that trained a policy


def announce_outcome(policy: str, status: str, reason: str | None = None,
                     parent_run_id: str | None = None) -> None:
    """Emit promoted or kept for a retrain round that trained; nothing for any other."""
    if status not in TRAINED:
        return
    payload = {k: v for k, v in (("reason", reason), ("parent_run_id", parent_run_id)) if v}
    emit(KEPT if status == "kept" else PROMOTED, POLICY_RESOURCE + policy, policy,
         {OUTCOME_LABEL: status}, payload)


def announce_approval(event: str, policy: str, version: str, payload: dict[str, Any]) -> None:
    """An approval event (requested, approved, rejected, timed-out) of candidate ``version``."""
    emit(event, POLICY_RESOURCE + policy, policy, {POLICY_VERSION_LABEL: str(version)},
         {k: v for k, v in payload.items() if v is not None})
