"""A served retrain round that waits for a person: the Prefect side.

``suspend_flow_run(wait_for_input=...)`` shows :class:`ApprovalForm` and ends the process, so a
wait of days holds no process or concurrency slot (``pause_flow_run`` would poll). On Resume the
run restarts from the top and asking again with the same key returns the stored answer.
Suspending needs a deployment; elsewhere a round ends "awaiting approval".
"""

from __future__ import annotations

import json
from typing import Literal

from prefect.client.orchestration import get_client
from prefect.client.schemas.responses import SetStateStatus
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from prefect.flow_runs import suspend_flow_run
from prefect.input import RunInput
from prefect.input.run_input import keyset_from_base_key
from prefect.runtime import deployment, flow_run
from prefect.settings import PREFECT_API_URL
from prefect.states import Completed
from pydantic import Field

KEY_PREFIX = "approval-v"  # + the candidate's version: the suspension's key in its flow run


class ApprovalForm(RunInput):
    """Approve the candidate (it becomes champion), or reject it (the champion stays)."""

    decision: Literal["Approve", "Reject"] = Field(
        description="Approve: the candidate becomes champion. Reject: the champion stays.")
    reason: str = Field(min_length=1, max_length=2000,
                        description="Why (recorded with your answer in MLflow)")


def pause_key(version: str) -> str:
    return f"{KEY_PREFIX}{version}"


def this_flow_run() -> tuple[str | None, bool]:
    """(this flow run's id, whether it runs from a deployment); (None, False) outside one."""
    return (str(flow_run.id) if flow_run.id else None), deployment.id is not None


def resumed_key() -> str | None:
    """The key of the approval this flow run was resumed from (None: it never waited)."""
    if flow_run.id is None or deployment.id is None:  # only a deployment's run is resumed
        return None
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run.id)
    keys = sorted(k for k in run.empirical_policy.pause_keys or () if k.startswith(KEY_PREFIX))
    return keys[-1] if keys else None


def ask(key: str, evidence: str | None = None, timeout_s: float | None = None) -> ApprovalForm:
    """The answer to approval ``key``: the first call suspends the run (its process exits
    here; Prefect fails it after ``timeout_s``); after Resume the same call returns it."""
    form = ApprovalForm if evidence is None else ApprovalForm.with_initial_data(evidence)
    return suspend_flow_run(wait_for_input=form, key=key,
                            timeout=None if timeout_s is None else max(1, int(timeout_s)))


def stored_answer(flow_run_id: str, key: str) -> ApprovalForm | None:
    """The answer the form stored for the approval ``key`` of the flow run (None: none)."""
    keys = keyset_from_base_key(f"suspended-{key}")  # Prefect's: state name + pause key
    with get_client(sync_client=True) as client:
        try:
            value = client.read_flow_run_input(flow_run_id, keys["response"])
        except (ObjectNotFound, PrefectHTTPStatusError) as err:
            if isinstance(err, PrefectHTTPStatusError) and err.response.status_code != 404:
                raise
            return None
    return ApprovalForm.model_validate(json.loads(value))


def run_state(flow_run_id: str) -> tuple[str, str]:
    """(state type, state name) of a flow run, e.g. ("PAUSED", "Suspended")."""
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
    return (state.type.value, state.name or "") if state else ("", "")


def resume_with(flow_run_id: str, decision: str, reason: str) -> bool:
    """Resume the waiting flow run with an answer given elsewhere -> whether it took it."""
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
        if state is None or not state.is_paused():
            return False
        out = client.resume_flow_run(flow_run_id, run_input={"decision": decision,
                                                             "reason": reason[:2000]})
    return out.status == SetStateStatus.ACCEPT


def close_waiting(flow_run_id: str, name: str, message: str) -> None:
    """End a flow run still waiting as Completed(``name``)."""
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
        if state is not None and state.is_paused():
            client.set_flow_run_state(flow_run_id, Completed(name=name, message=message),
                                      force=True)


def prefect_api() -> str | None:
    """The Prefect API this process talks to (None: none set, Prefect's ephemeral one)."""
    return PREFECT_API_URL.value() or None
