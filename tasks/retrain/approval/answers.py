"""The answers to a candidate (``retrain.approval: required``) and what they do.

A promoting round registers its policy as ``candidate``; answers come from the round's Prefect
form, `rlhf approve` / `rlhf reject`, or the deadline (``retrain.approval_timeout_h``). The
first answer is kept and its keeper carries it out; a later caller that finds one kept but not
carried out (its process died) finishes it after ``RLHF_APPROVAL_SETTLE_S``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from pydantic import BaseModel, ConfigDict

from rlhf_core.faults import crash_point
from tasks.platform.mlflow.errors import ApprovalError
from tasks.platform.mlflow.registry import CHAMPION, alias_version, move_champion
from tasks.platform.prefect.events import ANSWERED, POLICY_RESOURCE, POLICY_VERSION_LABEL, emit
from tasks.platform.prefect.logins import login_name
from tasks.retrain.approval import store, suspend
from tasks.retrain.approval.store import PENDING, Answer, Candidate

ENDED = ("CANCELLED", "CRASHED", "FAILED")  # a flow run's states that will not run again
SETTLE_ENV = "RLHF_APPROVAL_SETTLE_S"  # an answer kept but not carried out: left this long
WORDS = {"approve": "approved", "reject": "rejected", "timeout": "timed out"}


def settle_after_s() -> float:
    return float(os.environ.get(SETTLE_ENV) or 30)


def who(via: str) -> str:
    """Who answers: the Prefect login for the form, the MLflow one for the CLI (falling back)."""
    return login_name("prefect" if via == "prefect-ui" else "mlflow")


def request_approval(client, name: str, version: str | int, parent_run_id: str,
                     hours: float) -> None:
    """Mark ``version`` as a pending candidate until ``hours`` from now (a resumed register
    keeps the first deadline; an answered one is not asked again)."""
    found = store.candidate(client, name, version)
    if found is None or found.status == PENDING:
        store.mark_waiting(client, name, version, parent_run_id,
                           store.utc_now(hours) if found is None else found.deadline)


def announce_approval(event: str, policy: str, version: str, payload: dict[str, Any]) -> None:
    """An approval event (requested, approved, rejected, timed-out) of candidate ``version``."""
    emit(event, POLICY_RESOURCE + policy, policy, {POLICY_VERSION_LABEL: str(version)},
         {k: v for k, v in payload.items() if v is not None})


def champion_now(client, name: str) -> str | None:
    holder = alias_version(client, name, CHAMPION)
    return None if holder is None else str(holder.version)


class Outcome(BaseModel):
    """What an answer came to; ``given`` None: a kept answer carried out."""

    model_config = ConfigDict(frozen=True)
    candidate: Candidate
    answer: Answer
    given: Answer | None = None
    done_now: bool
    champion_before: str | None
    champion: str | None

    @property
    def agrees(self) -> bool:
        """The kept decision is the one given (or none was given)."""
        return self.given is None or self.given.decision == self.answer.decision

    def text(self) -> str:
        c, a = self.candidate, self.answer
        head = f"{c.name} v{c.version} {WORDS[a.decision]}"
        if a.decision == "timeout":
            head += f" (no answer by {c.deadline})"
        else:
            head += f" by {a.by} ({a.via}, {a.at}): {a.reason}"
        before = self.champion_before
        if a.decision == "approve" and self.done_now and before and before != c.version:
            where = f"champion v{before} -> v{c.version} (previous-champion: v{before})"
        elif a.decision != "approve" and self.done_now:
            where = f"champion v{self.champion} stays"
        else:
            where = f"champion v{self.champion}"
        lines = [f"{head}; {where}"]
        if self.given is None and self.done_now:
            lines.append("carried out now: the process that kept this answer stopped first")
        elif self.given is not None and not self.done_now:
            lines.append(f"it was {WORDS[a.decision]} before this answer: nothing changed")
        if self.given is not None and self.given != a:
            lines.append(f"your answer ({self.given.decision}) came after it and was not "
                         "taken" + ("" if self.agrees else "; nothing changed"))
        return "\n".join(lines)


def timed_out(cand: Candidate) -> Answer:
    return Answer(decision="timeout", reason=f"no answer by the deadline {cand.deadline}",
                  by="rlhf", via="timeout", at=cand.deadline)


def _wait_for_keeper(client, cand: Candidate) -> Candidate:
    """The candidate once its answer's keeper carried it out, or ``settle_after_s`` passed."""
    while True:
        now = store.candidate(client, cand.name, cand.version)
        if now.status != PENDING or now.answer is None:
            return now
        left = settle_after_s() - (time.time() - store.utc_seconds(now.answer.at))
        if left <= 0:
            return now
        time.sleep(min(1.0, left))


def carry_out(client, cand: Candidate, given: Answer | None) -> Outcome:
    """Keep ``given`` unless an answer (or the timeout) came first; carry out the kept one."""
    kept = cand.answer
    if kept is None and given is not None:
        kept = store.claim_answer(client, cand, timed_out(cand) if cand.overdue else given)
    if given is not None and kept != given and kept.decision != "timeout":
        cand = _wait_for_keeper(client, cand)  # another process kept it: let it finish
    before, done_now = champion_now(client, cand.name), cand.status == PENDING
    if done_now:
        crash_point("approval:answered")
        if kept.decision == "approve" and before != cand.version:
            move_champion(client, cand.name, cand.version, "approve",
                          f"approved by {kept.by} ({kept.via}): {kept.reason}")
        store.release_candidate_alias(client, cand.name, cand.version)
        announce_approval(ANSWERED[kept.decision], cand.name, cand.version, {
            "by": kept.by, "at": kept.at, "via": kept.via, "reason": kept.reason,
            "parent_run_id": cand.parent_run_id, "champion_before": before})
        store.record_decided(client, cand, kept)
    return Outcome(candidate=cand, answer=kept, given=given, done_now=done_now,
                   champion_before=before,
                   champion=champion_now(client, cand.name) if done_now else before)


def pick(client, name: str, version: str | None) -> Candidate:
    """The candidate an answer is for: ``version``, else the only one waiting."""
    if version is not None:
        found = store.candidate(client, name, version)
        if found is None:
            raise ApprovalError(f"'{name}' v{version} is no candidate for approval (only a "
                                "retrain round with retrain.approval: required makes one); "
                                f"{waiting_line(client, name)}")
        return found
    waiting = store.waiting_candidates(client, name)
    if len(waiting) == 1:
        return waiting[0]
    raise ApprovalError(f"'{name}': {waiting_line(client, name)}" + (
        "; name one: rlhf approve VERSION --reason ... (or rlhf reject)" if waiting else ""))


def waiting_line(client, name: str) -> str:
    """Which candidates wait, with the champion each was compared with and its deadline."""
    waiting = store.waiting_candidates(client, name)
    if not waiting:
        return f"no candidate waits for approval (champion: v{champion_now(client, name)})"
    return f"{len(waiting)} candidate(s) wait for approval: " + "; ".join(
        f"v{c.version} (compared with champion v{c.gated_against}, round run "
        f"{c.parent_run_id}, deadline {c.deadline})" for c in waiting)


def check_current(client, cand: Candidate, given: Answer) -> None:
    """An approval to keep needs the champion the candidate was compared with still in place."""
    if cand.status != PENDING or cand.answer is not None or given.decision != "approve" \
            or cand.overdue:
        return
    now = champion_now(client, cand.name)
    if cand.gated_against and now not in (cand.gated_against, cand.version):
        raise ApprovalError(
            f"'{cand.name}' v{cand.version} was compared with champion v{cand.gated_against}"
            f", but the champion is now v{now}: approving it would promote a policy never "
            f"compared with v{now}. Reject it (rlhf reject {cand.version} --reason ...), or "
            f"compare the two first (rlhf compare {now} {cand.version})")


def answer(client, name: str, version: str | None, decision: str, reason: str, via: str,
           by: str | None = None) -> Outcome:
    """Approve or reject ``version`` (None: the only one waiting) unless an answer came first."""
    cand = pick(client, name, version)
    left = form_left(cand) if cand.status == PENDING and cand.answer is None else None
    if left is not None:  # answered on its form first, and its flow run ended without it
        carry_out(client, cand, left)
        cand = store.candidate(client, name, cand.version)
    given = Answer(decision=decision, reason=reason, by=by or who(via), via=via)
    check_current(client, cand, given)
    return carry_out(client, cand, given)


def settle_waiting(client, name: str) -> list[Outcome]:
    """Carry out what waits on nobody: an answer whose keeper died, a form answer whose flow
    run ended without it, and a deadline passed with no answer."""
    out = []
    for cand in store.waiting_candidates(client, name):
        if cand.answer is not None:
            if time.time() - store.utc_seconds(cand.answer.at) >= settle_after_s():
                out.append(carry_out(client, cand, None))
            continue
        form = form_left(cand)
        if form is not None:
            out.append(carry_out(client, cand, form))
        elif cand.overdue:
            out.append(carry_out(client, cand, timed_out(cand)))
            if cand.flow_run_id and suspend.prefect_api() is not None:  # a served round waits
                suspend.close_waiting(cand.flow_run_id, "Timed out", out[-1].text())
    return out


def form_answer(form: suspend.ApprovalForm) -> Answer:
    return Answer(decision=form.decision.lower(), reason=form.reason, by=who("prefect-ui"),
                  via="prefect-ui")


def form_left(cand: Candidate) -> Answer | None:
    """A form answer whose flow run ended (cancelled, crashed) without carrying it out."""
    if not cand.flow_run_id or suspend.prefect_api() is None:
        return None
    if suspend.run_state(cand.flow_run_id)[0] not in ENDED:
        return None
    form = suspend.stored_answer(cand.flow_run_id, suspend.pause_key(cand.version))
    return None if form is None else form_answer(form)
