"""A served retrain round that waits for a person: the Prefect side.

Prefect 3's ``suspend_flow_run(wait_for_input=...)`` puts the typed form (:class:`ApprovalForm`,
its description the evidence, in markdown) on the flow run's page and ends the run's process:
the run is Suspended (a Paused state that reschedules) and holds no process and no deployment
concurrency slot while it waits, for days if need be. The form's Resume sends the answer; the
server stores it as the run's input and schedules the run again, and ``rlhf serve`` (or a
worker) starts it anew from the top: the flow sees it was resumed (:func:`resumed_key`) and
asks again with the same key, which returns the stored answer at once. ``pause_flow_run``
would instead keep the process polling for the whole wait.

Suspending needs a deployment; a round run elsewhere (`rlhf retrain`) ends "awaiting
approval" and is answered with `rlhf approve` / `rlhf reject`, which also resume a served
round's run with their answer (:func:`resume_with`), so it ends saying what was decided.
"""

from __future__ import annotations

import json
from typing import Literal

from prefect.input import RunInput
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


def key_version(key: str) -> str:
    return key.removeprefix(KEY_PREFIX)


def this_flow_run() -> tuple[str | None, bool]:
    """(this flow run's id, whether it runs from a deployment); (None, False) outside one."""
    from prefect.runtime import deployment, flow_run

    return (str(flow_run.id) if flow_run.id else None), deployment.id is not None


def resumed_key() -> str | None:
    """The approval this flow run waited for and was resumed from (its key), else None (a
    run that never waited)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import deployment, flow_run

    if flow_run.id is None or deployment.id is None:  # only a deployment's run is resumed
        return None
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run.id)
    keys = sorted(k for k in run.empirical_policy.pause_keys or () if k.startswith(KEY_PREFIX))
    return keys[-1] if keys else None


def ask(key: str, evidence: str | None = None, timeout_s: float | None = None) -> ApprovalForm:
    """Wait for the answer to the approval ``key``: the first call suspends this flow run
    with the form (``evidence`` above it; no answer within ``timeout_s``: Prefect fails the
    run) and its process exits here; in the run started again on Resume, the same call
    returns the answer."""
    from prefect.flow_runs import suspend_flow_run

    form = ApprovalForm if evidence is None else ApprovalForm.with_initial_data(evidence)
    return suspend_flow_run(wait_for_input=form, key=key,
                            timeout=None if timeout_s is None else max(1, int(timeout_s)))


def _keyset(key: str) -> dict[str, str]:
    from prefect.input.run_input import keyset_from_base_key

    return keyset_from_base_key(f"suspended-{key}")  # Prefect's: state name + pause key


def stored_answer(flow_run_id: str, key: str) -> ApprovalForm | None:
    """The answer the form stored for the approval ``key`` of the flow run (None: none)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError

    with get_client(sync_client=True) as client:
        try:
            value = client.read_flow_run_input(flow_run_id, _keyset(key)["response"])
        except (ObjectNotFound, PrefectHTTPStatusError) as err:
            if isinstance(err, PrefectHTTPStatusError) and err.response.status_code != 404:
                raise
            return None
    return ApprovalForm.model_validate(json.loads(value))


def run_state(flow_run_id: str) -> tuple[str, str]:
    """(state type, state name) of a flow run, e.g. ("PAUSED", "Suspended")."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
    return (state.type.value, state.name or "") if state else ("", "")


def resume_with(flow_run_id: str, decision: str, reason: str) -> bool:
    """Resume the waiting flow run with an answer given elsewhere (Approve or Reject) ->
    whether it was waiting and took it (False: resumed already, or ended)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.responses import SetStateStatus

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
        if state is None or not state.is_paused():
            return False
        out = client.resume_flow_run(flow_run_id, run_input={"decision": decision,
                                                             "reason": reason[:2000]})
    return out.status == SetStateStatus.ACCEPT


def close_waiting(flow_run_id: str, name: str, message: str) -> bool:
    """End a flow run still waiting for its answer as Completed (``name``, e.g. "Timed
    out", and ``message``): the answer came another way -> whether it was waiting."""
    from prefect.client.orchestration import get_client
    from prefect.states import Completed

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
        if state is None or not state.is_paused():
            return False
        client.set_flow_run_state(flow_run_id, Completed(name=name, message=message),
                                  force=True)
    return True


def prefect_api() -> str | None:
    """The Prefect API this process talks to (None: none set, Prefect's ephemeral one)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None
