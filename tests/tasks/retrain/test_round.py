"""tasks/retrain/round.py: retrain flow-run names say what the run did; a retrain's outcome is
announced as promoted or kept, and nothing is announced when nothing trained."""

from __future__ import annotations

from tasks.retrain import round as retrain_round
from tasks.retrain.round import announce_outcome, retrain_run_name


def test_retrain_run_names_name_policy_champion_and_batches():
    assert retrain_run_name("rlhf-policy", "3", ["1a2b3c4d5e6f", "ffff"]) == \
        "retrain-rlhf-policy-v3-1a2b3c4d+1"
    assert retrain_run_name("p", None, ["abcdef0123"]) == "retrain-p-bootstrap-abcdef01"
    assert retrain_run_name("p", "2", []) == "retrain-p-v2-nothing-new"
    # a first champion trains on the configured data: it did not find "nothing new"
    assert retrain_run_name("p", None, []) == "retrain-p-bootstrap"


def test_outcomes_are_announced_as_promoted_or_kept(monkeypatch):
    sent = []
    monkeypatch.setattr(retrain_round, "emit", lambda *a: sent.append(a))
    announce_outcome("p", "kept", "no significant win")
    announce_outcome("p", "bootstrapped", None, "r1")
    announce_outcome("p", "nothing new")
    announce_outcome("p", "skipped")
    announce_outcome("p", "control", "a control round", "r2")
    assert [(s[0], s[1], s[3]["rlhf.outcome"]) for s in sent] == [
        ("rlhf.champion.kept", "rlhf.policy.p", "kept"),
        ("rlhf.champion.promoted", "rlhf.policy.p", "bootstrapped")]
    assert sent[0][4] == {"reason": "no significant win"}
    assert sent[1][4] == {"parent_run_id": "r1"}
