"""A person's sign-off of a retrain's candidate on a real SQLite registry (no training):
approve, reject and the deadline, each recorded on the version and the round's run with an
event; answers at once (one kept, one promotion); a process killed between the answer and
the alias move, finished by the next answer or the keeper; which candidate an answer is
for; a stale approval refused; ``retrain.approval: none`` holding nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from mlflow.tracking import MlflowClient

from tasks.platform.mlflow.errors import ApprovalError
from tasks.platform.mlflow.registry import CANDIDATE, CHALLENGER, CHAMPION, PREVIOUS, move_champion
from tasks.platform.mlflow.tags import (
    ALIAS_LOG_TAG,
    APPROVAL_ANSWER_PARAM,
    CHAMPION_VERSION_TAG,
    GATE_REASON_TAG,
    GATE_SCORER_TAG,
    GATE_TAG,
    HEALTH_FLAGS_TAG,
    PIPELINE_RUN_TAG,
)
from tasks.retrain.approval import answers as approval
from tasks.retrain.approval.store import candidate, round_evidence, waiting_candidates
from tests.shared import ROOT

NAME = "rlhf-policy"


@pytest.fixture
def sent(monkeypatch):
    out = []
    monkeypatch.setattr(approval, "emit", lambda *a: out.append(a))
    return out


@pytest.fixture
def store(tmp_path):
    """A registry whose champion is v1, with ``add(hours)`` making the next round's
    candidate (its round's run carries the gate's tags), waiting ``hours``."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("rlhf-test")
    client.create_registered_model(NAME)

    def version(champion: str | None, tags: dict[str, str] | None = None) -> str:
        run = client.create_run(exp, tags=tags or {}).info.run_id
        client.log_param(run, "retrain.gate.confidence", "0.95")
        client.set_terminated(run)
        v = client.create_model_version(NAME, str(tmp_path), run).version
        client.set_model_version_tag(NAME, v, PIPELINE_RUN_TAG, run)
        client.set_model_version_tag(NAME, v, GATE_TAG, "significant win")
        if champion:
            client.set_model_version_tag(NAME, v, CHAMPION_VERSION_TAG, champion)
        return str(v)

    move_champion(client, NAME, version(None), "register", "first")

    def add(hours: float = 72.0, against: str = "1") -> str:
        v = version(against, {"rlhf.gate.win_rate": "0.62", "rlhf.gate.diff_mean": "0.3",
                              GATE_SCORER_TAG: "gold judge", GATE_REASON_TAG: "significant win",
                              HEALTH_FLAGS_TAG: "kl_spike, "})
        client.set_registered_model_alias(NAME, CHALLENGER, v)
        run = client.get_model_version(NAME, v).tags[PIPELINE_RUN_TAG]
        approval.request_approval(client, NAME, v, run, hours)
        return v

    return client, add, uri


def _aliases(client) -> dict[str, str]:
    return {a: str(v) for a, v in client.get_registered_model(NAME).aliases.items()}


def _moves(client) -> list[dict]:
    log = client.get_registered_model(NAME).tags.get(ALIAS_LOG_TAG, "")
    return [json.loads(x) for x in log.splitlines() if x]


def test_approve_promotes_once_and_records_the_answer_everywhere(store, sent):
    client, add, _ = store
    v = add()
    assert _aliases(client) == {CHAMPION: "1", CANDIDATE: v, CHALLENGER: v}
    out = approval.answer(client, NAME, None, "approve", "judged by hand", "cli", by="alice")
    assert out.done_now and out.champion_before == "1" and out.champion == v
    assert _aliases(client) == {CHAMPION: v, PREVIOUS: "1"}  # no candidate, no challenger
    assert [m["action"] for m in _moves(client)] == ["register", "approve"]
    for tags in (client.get_model_version(NAME, v).tags,
                 client.get_run(out.candidate.parent_run_id).data.tags):
        assert tags["rlhf.approval.status"] == "approved"
        assert (tags["rlhf.approval.by"], tags["rlhf.approval.via"]) == ("alice", "cli")
        assert tags["rlhf.approval.reason"] == "judged by hand" and tags["rlhf.approval.at"]
    (event, resource, _, labels, payload), = sent
    assert (event, resource) == ("rlhf.champion.approved", f"rlhf.policy.{NAME}")
    assert labels == {"rlhf.policy_version": v} and payload["by"] == "alice"
    assert "v1 -> v2" in out.text() and waiting_candidates(client, NAME) == []
    again = approval.answer(client, NAME, v, "approve", "twice", "cli", by="bob")
    assert not again.done_now and again.answer.by == "alice" and again.agrees
    assert "approved before this answer: nothing changed" in again.text()
    assert len(_moves(client)) == 2 and len(sent) == 1  # no second promotion, no event


def test_reject_keeps_the_champion_and_a_late_contrary_answer_changes_nothing(store, sent):
    client, add, _ = store
    v = add()
    out = approval.answer(client, NAME, v, "reject", "too terse", "cli", by="carol")
    assert out.champion == "1" and "champion v1 stays" in out.text()
    assert _aliases(client) == {CHAMPION: "1", CHALLENGER: v}
    assert client.get_model_version(NAME, v).tags["rlhf.approval.status"] == "rejected"
    assert sent[0][0] == "rlhf.champion.rejected"
    late = approval.answer(client, NAME, v, "approve", "changed my mind", "cli", by="dan")
    assert not late.agrees and late.answer.decision == "reject"
    assert _aliases(client)[CHAMPION] == "1" and len(_moves(client)) == 1


def test_the_deadline_keeps_the_champion_and_a_late_approval_finds_it(store, sent):
    client, add, _ = store
    v = add(hours=-0.001)  # the deadline passed
    (out,) = approval.settle_waiting(client, NAME)
    assert out.answer.decision == "timeout" and out.answer.via == "timeout"
    assert _aliases(client) == {CHAMPION: "1", CHALLENGER: v}
    assert client.get_model_version(NAME, v).tags["rlhf.approval.status"] == "timed-out"
    assert sent[0][0] == "rlhf.champion.timed-out" and "no answer by" in out.text()
    w = add(hours=-0.001)  # an approval after the deadline: the timeout is kept
    late = approval.answer(client, NAME, w, "approve", "sorry, late", "cli", by="eve")
    assert late.answer.decision == "timeout" and not late.agrees
    assert _aliases(client)[CHAMPION] == "1"


def test_answers_at_once_keep_one_and_promote_once(store, sent):
    """Four approvals and a rejection at the same moment, each with its own client (as a
    double click and the CLI would): one answer kept, one alias move at most."""
    client, add, uri = store
    v = add()
    outcomes, errors = [], []
    start = threading.Barrier(5)

    def answer(decision: str, by: str) -> None:
        try:
            start.wait()
            outcomes.append(approval.answer(MlflowClient(uri), NAME, v, decision, "go",
                                            "cli", by=by))
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=answer, args=(d, f"u{i}")) for i, d in
               enumerate(["approve"] * 4 + ["reject"])]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors and len(outcomes) == 5
    kept = {o.answer for o in outcomes}
    assert len(kept) == 1 and sum(o.done_now for o in outcomes) == 1
    (answer_kept,) = kept
    moves = [m for m in _moves(client) if m["action"] == "approve"]
    assert len(moves) == (answer_kept.decision == "approve")
    assert _aliases(client)[CHAMPION] == (v if answer_kept.decision == "approve" else "1")
    assert len(sent) == 1


def test_a_kill_between_the_answer_and_the_alias_move_is_finished_later(store, sent,
                                                                      monkeypatch):
    """`rlhf approve` killed once its answer is kept, before the alias moves: the next
    `rlhf approve` (here in this process) finds the answer and, once the killed one's time
    has passed, carries it out: one promotion, the first answer's."""
    import getpass

    from tests.shared import TEST_CONFIG

    client, add, uri = store
    v = add()
    out = subprocess.run([sys.executable, "-m", "cli", "approve", v, "--reason", "ship it",
                          "--config", str(TEST_CONFIG), "--set",
                          f"tracking.tracking_uri={uri}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300,
                         env={**os.environ, "RLHF_CRASH_AT": "approval:answered"})
    assert out.returncode == -9, out.stdout[-2000:] + out.stderr[-2000:]
    run = candidate(client, NAME, v).parent_run_id
    kept = json.loads(client.get_run(run).data.params[APPROVAL_ANSWER_PARAM])
    assert (kept["by"], kept["reason"]) == (getpass.getuser(), "ship it")
    assert _aliases(client)[CHAMPION] == "1"  # killed before the move
    assert candidate(client, NAME, v).status == "pending"
    monkeypatch.setenv(approval.SETTLE_ENV, "0.5")  # the killed one gets half a second
    again = approval.answer(client, NAME, None, "approve", "retry", "cli", by="grace")
    assert again.done_now and again.answer.reason == "ship it" and again.agrees
    assert "came after it and was not taken" in again.text()
    assert _aliases(client)[CHAMPION] == v
    assert [m["action"] for m in _moves(client)].count("approve") == 1
    assert [e[0] for e in sent] == ["rlhf.champion.approved"]


def test_the_keeper_finishes_an_answer_left_half_done(store, sent, monkeypatch):
    client, add, _ = store
    v = add()
    cand = candidate(client, NAME, v)
    from tasks.retrain.approval.store import Answer, claim_answer

    claim_answer(client, cand, Answer(decision="reject", reason="no", by="hal", via="cli",
                                      at="2020-01-01T00:00:00Z"))  # its process long gone
    (out,) = approval.settle_waiting(client, NAME)
    assert out.done_now and out.given is None and "carried out now" in out.text()
    assert candidate(client, NAME, v).status == "rejected" and sent[0][0].endswith("rejected")


def test_the_keeper_takes_a_form_answer_its_run_ended_without_and_ends_late_waits(
        store, sent, monkeypatch):
    """A served round's Resume stored its answer but the run was cancelled before carrying
    it out (the deployment's concurrency limit): the keeper carries it out as the form's.
    Another round still waiting at its deadline: timed out, and its flow run ended."""
    from tasks.retrain.approval import suspend
    from tasks.retrain.approval.store import note_flow_run
    from tasks.retrain.approval.suspend import ApprovalForm

    client, add, _ = store
    answered, late = add(), add(hours=-0.001)
    note_flow_run(client, candidate(client, NAME, answered), "run-answered")
    note_flow_run(client, candidate(client, NAME, late), "run-late")
    states = {"run-answered": "CANCELLED", "run-late": "PAUSED"}
    closed = []
    monkeypatch.setattr(suspend, "prefect_api", lambda: "http://prefect")
    monkeypatch.setattr(suspend, "run_state", lambda run: (states[run], ""))
    monkeypatch.setattr(suspend, "stored_answer", lambda run, key: ApprovalForm(
        decision="Approve", reason="looks right") if run == "run-answered" else None)
    monkeypatch.setattr(suspend, "close_waiting", lambda *a: closed.append(a))
    first, second = approval.settle_waiting(client, NAME)
    assert (first.answer.decision, first.answer.via, first.answer.reason) == (
        "approve", "prefect-ui", "looks right")
    assert _aliases(client)[CHAMPION] == answered
    assert second.answer.decision == "timeout"
    assert [(run, name) for run, name, _ in closed] == [("run-late", "Timed out")]
    assert "timed out (no answer by" in closed[0][2]
    assert [e[0] for e in sent] == ["rlhf.champion.approved", "rlhf.champion.timed-out"]


def test_which_candidate_an_answer_is_for(store, sent):
    client, add, _ = store
    with pytest.raises(ApprovalError, match="no candidate waits for approval .champion: v1"):
        approval.answer(client, NAME, None, "approve", "x", "cli")
    with pytest.raises(ApprovalError, match="v1 is no candidate"):
        approval.answer(client, NAME, "1", "approve", "x", "cli")
    first, second = add(), add()
    with pytest.raises(ApprovalError, match=rf"2 candidate\(s\) wait for approval: v{first} "
                       rf".*v{second} .*name one"):
        approval.answer(client, NAME, None, "approve", "x", "cli")
    approval.answer(client, NAME, second, "approve", "x", "cli")
    # the first was compared with v1, which is champion no more: not approved blindly
    with pytest.raises(ApprovalError, match=f"compared with champion v1, but the champion "
                       f"is now v{second}"):
        approval.answer(client, NAME, None, "approve", "x", "cli")
    assert approval.answer(client, NAME, None, "reject", "stale", "cli").done_now


def test_the_evidence_reads_the_rounds_figures_and_flags(store):
    client, add, uri = store
    from tasks.retrain.approval.waiting import evidence_markdown

    cand = candidate(client, NAME, add())
    ev = round_evidence(client, cand, "gate/side_by_side.json")
    assert ev.figures["win_rate"] == "0.62" and ev.health_flags == ["kl_spike"]
    assert ev.champion_run_id is not None and ev.side_by_side == []
    text = evidence_markdown(cand, ev, uri)
    assert "- **paired win rate**: 0.620" in text and "- **health flags**: kl_spike" in text
    assert "compare-runs" in text and f"rlhf approve {cand.version}" in text


def test_approval_none_holds_nothing():
    from tasks.config.pipeline_config import load_config
    from tasks.pipeline.rule import Decision
    from tasks.retrain.approval.waiting import held_for_approval

    promote = Decision(promote=True, reason="won")
    none = load_config(ROOT / "configs" / "test.yaml")
    assert none.retrain.approval == "none" and none.retrain.approval_timeout_h == 72
    assert held_for_approval(none, promote) is promote
    required = load_config(ROOT / "configs" / "test.yaml", ["retrain.approval=required"])
    assert held_for_approval(required, promote).hold
    assert held_for_approval(required, promote).register_tag == "gate: promote, awaiting " \
        "approval"
    assert not held_for_approval(required, Decision(promote=False, reason="lost")).hold
