"""A round's candidate waits for a person: what the retrain flow and `rlhf serve` call.

A served run suspends with the approval form (:func:`ask_for_approval`) and, resumed, carries
out the answer (:func:`resumed_round`); `rlhf serve`'s :func:`keeper` thread ends overdue
waits and finishes answers left half done.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.rule import Decision
from tasks.pipeline.stages.records import RegisterRecord
from tasks.platform.mlflow.runs import RunContext, default_tracking_uri, tracking_client
from tasks.platform.prefect.events import APPROVAL_REQUESTED
from tasks.retrain import events
from tasks.retrain.approval.answers import (
    WORDS,
    Outcome,
    carry_out,
    champion_now,
    check_current,
    form_answer,
    request_approval,
    settle_waiting,
)
from tasks.retrain.approval.evidence import evidence_markdown
from tasks.retrain.approval.store import (
    PENDING,
    candidate,
    note_flow_run,
    round_evidence,
    utc_seconds,
)
from tasks.retrain.approval.suspend import (
    ask,
    key_version,
    pause_key,
    prefect_api,
    resume_with,
    resumed_key,
    this_flow_run,
)
from tasks.retrain.gate.stage import SIDE_BY_SIDE
from tasks.retrain.records import RetrainResult

CHECK_ENV = "RLHF_APPROVAL_CHECK_S"  # how often `rlhf serve` settles waiting candidates
GRACE_S = 600  # Prefect fails a wait this long after the deadline, if nothing ended it first


def held_for_approval(config: PipelineConfig, decision: Decision) -> Decision:
    """The gate's decision, held for a person when it promotes and approval is required."""
    if config.retrain.approval == "required" and decision.promote:
        return decision.model_copy(update={"hold": True})
    return decision


def awaiting_text(config: PipelineConfig, result: RetrainResult) -> str | None:
    """A waiting round's outcome with the ways to answer (None: it waits for nobody)."""
    if result.status != "awaiting approval":
        return None
    name = config.tracking.registered_policy
    client = tracking_client(default_tracking_uri(config.tracking.tracking_uri))
    cand = candidate(client, name, str(result.candidate))
    v = cand.version
    return (f"Retrain awaiting approval: candidate `models:/{name}/{v}` (alias `candidate`)"
            f"; the gate: {cand.gate_reason}. Champion v{champion_now(client, name)} stays "
            f"until a person approves, by {cand.deadline}: the flow run's Resume form (a "
            f"served round), or `rlhf approve {v} --reason \"...\"` / `rlhf reject {v} "
            "--reason \"...\"`.")


def settle_approvals(config: PipelineConfig) -> None:
    """Before a round: end overdue waits and finish answers left half done."""
    if config.retrain.approval != "required":
        return
    client = tracking_client(default_tracking_uri(config.tracking.tracking_uri))
    for outcome in settle_waiting(client, config.tracking.registered_policy):
        print(outcome.text())


def publish_answer(config: PipelineConfig, answered: RetrainResult) -> None:
    """Publish a resumed round's outcome artifact and summary."""
    from tasks.pipeline.summary import publish_text
    from tasks.platform.prefect.prefect_api import report
    from tasks.retrain.round import OUTCOME

    title = f"Retrain {answered.status}: candidate v{answered.candidate}"
    report(OUTCOME, f"# {title}\n\n{answered.answer}\n", "retrain outcome")
    publish_text(f"retrain: {answered.status}", answered.answer or "")


def publish_outcome(config: PipelineConfig, result: RetrainResult) -> None:
    """Publish a trained round's event and summary, saying why (or that it waits)."""
    from tasks.pipeline.summary import publish_summary

    events.announce_outcome(config.tracking.registered_policy, result.status,
                            result.decision and result.decision.reason,
                            result.run and result.run.parent_run_id)
    if result.run is not None:
        reason = result.decision.reason if result.decision else ""
        publish_summary(result.run, f"{result.run.run_name}: {result.status}",
                        awaiting_text(config, result) or f"Retrain {result.status}"
                        + (f": {reason}" if reason else "."))


def hold_candidate(ctx: RunContext, config: PipelineConfig, reg: RegisterRecord) -> None:
    """A version register held for a person becomes ``candidate`` with its deadline."""
    if reg.awaiting_approval:
        request_approval(ctx.client(), reg.model_name, reg.version, ctx.parent_run_id,
                         config.retrain.approval_timeout_h)


def ask_for_approval(config: PipelineConfig, result: RetrainResult) -> RetrainResult:
    """Announce the wait; a served run then suspends with the form (its process ends here),
    any other returns ``result``."""
    uri = default_tracking_uri(config.tracking.tracking_uri)
    client = tracking_client(uri)
    cand = candidate(client, config.tracking.registered_policy, str(result.candidate))
    flow_run_id, served = this_flow_run()
    events.announce_approval(APPROVAL_REQUESTED, cand.name, cand.version, {
        "deadline": cand.deadline, "parent_run_id": cand.parent_run_id,
        "gated_against": cand.gated_against, "flow_run_id": flow_run_id if served else None})
    if not served:
        return result
    note_flow_run(client, cand, flow_run_id)
    evidence = evidence_markdown(cand, round_evidence(client, cand, SIDE_BY_SIDE), uri)
    print(f"waiting for a person: candidate v{cand.version}, answer by {cand.deadline} "
          "(this flow run's Resume form, or rlhf approve / rlhf reject)")
    ask(pause_key(cand.version), evidence, utc_seconds(cand.deadline) - time.time() + GRACE_S)
    return result  # not reached in a served run: the process ends in ask()


def resumed_round(config: PipelineConfig) -> RetrainResult | None:
    """Carry out the answer this resumed flow run waited for -> the round's result (None: it
    never waited)."""
    if config.retrain.approval != "required":  # (a resumed run has the same parameters)
        return None
    key = resumed_key()
    if key is None:
        return None
    form = ask(key)  # the stored answer, at once
    client = tracking_client(default_tracking_uri(config.tracking.tracking_uri))
    cand = candidate(client, config.tracking.registered_policy, key_version(key))
    given = form_answer(form)
    kept = cand.answer
    if cand.status != PENDING and kept and (kept.decision, kept.reason) == \
            (given.decision, given.reason):  # resumed by the answer that decided (the CLI)
        given = None
    elif cand.status == PENDING and kept is None and given.decision == "approve" \
            and not cand.overdue:
        check_current(client, cand)
    outcome = carry_out(client, cand, given) if given is not None else Outcome(
        candidate=cand, answer=kept, done_now=False, champion_before=cand.gated_against,
        champion=champion_now(client, cand.name))
    print(outcome.text())
    return RetrainResult(status=WORDS[outcome.answer.decision], candidate=int(cand.version),
                         answer=outcome.text())


@contextmanager
def keeper(config: PipelineConfig) -> Iterator[None]:
    """While the body runs, settle waiting candidates in a thread every
    ``RLHF_APPROVAL_CHECK_S`` seconds (approval required only)."""
    if config.retrain.approval != "required":
        yield
        return
    every = float(os.environ.get(CHECK_ENV) or 60)
    stop = threading.Event()
    client = tracking_client(default_tracking_uri(config.tracking.tracking_uri))

    def loop() -> None:
        failing = False
        while not stop.wait(every):
            try:
                for outcome in settle_waiting(client, config.tracking.registered_policy):
                    print(f"rlhf: {outcome.text()}", flush=True)
                failing = False
            except Exception as err:  # noqa: BLE001 - a server away: try again next time
                if not failing:
                    print(f"rlhf: approvals not settled ({type(err).__name__}: {err}); "
                          f"trying every {every:g} s", flush=True)
                failing = True

    thread = threading.Thread(target=loop, name="rlhf-approvals", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()


def tell_waiting_run(outcome: Outcome) -> str | None:
    """Resume a served round still waiting on its form with the kept answer -> a line saying
    so (None: no run waits)."""
    cand, kept = outcome.candidate, outcome.answer
    if not cand.flow_run_id or kept.decision == "timeout":
        return None
    where = f"the round's flow run {cand.flow_run_id}"
    if prefect_api() is None:
        return (f"{where} may still wait on its Prefect form: with PREFECT_API_URL set to "
                "its server, run this command again to end it (else it ends at the deadline)")
    try:
        resumed = resume_with(cand.flow_run_id, kept.decision.capitalize(), kept.reason)
    except Exception as err:  # noqa: BLE001 - the answer is kept in MLflow either way
        return f"{where} was not resumed ({type(err).__name__}: {err}); it ends at the deadline"
    return f"{where} resumed with this answer" if resumed else None
