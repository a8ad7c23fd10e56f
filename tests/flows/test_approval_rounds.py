"""A person signs off the champion, from the command line: real `rlhf retrain` rounds on the
tiny config (the session's Prefect API, MLflow at tmp_path) with ``retrain.approval:
required``. A round whose gate says promote ends "awaiting approval" with the commands that
answer it, the champion unmoved and the round shown waiting by `rlhf runs`; `rlhf approve`
(no version: the only candidate) makes the candidate champion, once; the next round's
candidate is rejected and the champion stays; a third left past its deadline is timed out,
and an approval after it changes nothing. Each answer is on the version's tags and the
round's run, and its events reach the Prefect server. The gate is told to promote (a margin
far below any difference, no guard rail): the point is the sign-off, not the win."""

from __future__ import annotations

import httpx
import pytest
from mlflow.tracking import MlflowClient

from rlhf_core.demo import write_preference_batch
from tasks.platform.mlflow.registry import CANDIDATE, CHAMPION, PREVIOUS
from tests.shared import TEST_CONFIG, rlhf_in_process

NAME = "rlhf-policy"
PROMOTE = ["retrain.gate.margin=-1000", "retrain.gate.max_kl=1000000",
           "retrain.gate.max_eos_drop=1"]


def _sets(tmp_path, *more: str) -> list[str]:
    out = []
    for s in [f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
              f"tracking.workdir={tmp_path}/work", f"retrain.watch_dir={tmp_path}/watch",
              "demo.n_eval=8", "retrain.gate.min_prompts=8", "tracking.system_metrics=false",
              "demo.n_pref=200", *more]:
        out += ["--set", s]
    return out


def _aliases(client) -> dict[str, str]:
    return {a: str(v) for a, v in client.get_registered_model(NAME).aliases.items()}


def _events(api: str, since: str) -> list[tuple[str, str]]:
    """(event, candidate version) of the rlhf.champion.* events the server has since
    ``since``."""
    body = {"filter": {"event": {"prefix": ["rlhf.champion."]},
                       "occurred": {"since": since}}, "limit": 50}
    found = httpx.post(f"{api}/events/filter", json=body, timeout=30).json()["events"]
    return sorted((e["event"], e["resource"].get("rlhf.policy_version", ""))
                  for e in found)


@pytest.fixture
def rounds(tmp_path, capfd, prefect_api):
    """`rlhf ARGS` with this test's store and settings."""
    def run(*args: str, more=(), code: int = 0) -> str:
        out = rlhf_in_process([*args, "--config", str(TEST_CONFIG), *_sets(tmp_path, *more)],
                              capfd, PREFECT_API_URL=prefect_api)
        assert out.returncode == code, out.stdout[-3000:] + out.stderr[-3000:]
        return out.stdout + out.stderr
    return run


def _a_round_nobody_answers_in_time(tmp_path, rounds, client, required: list[str]) -> None:
    """v4 waits 7 s; an approval after that finds it timed out, and changes nothing."""
    import time

    write_preference_batch(tmp_path / "watch", 100, 6)
    assert "retrain: awaiting approval" in rounds(
        "retrain", more=[*required, "retrain.approval_timeout_h=0.002"])
    deadline = client.get_model_version(NAME, "4").tags["rlhf.approval.deadline"]
    while time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) <= deadline:
        time.sleep(1)
    late = rounds("approve", "4", "--reason", "sorry, late", more=required, code=2)
    assert f"v4 timed out (no answer by {deadline}); champion v2" in late, late
    assert "your answer (approve) came after it and was not taken; nothing changed" in late
    assert client.get_model_version(NAME, "4").tags["rlhf.approval.status"] == "timed-out"
    assert _aliases(client) == {CHAMPION: "2", PREVIOUS: "1", "challenger": "4"}


def test_a_cli_round_waits_for_approve_then_the_next_is_rejected(tmp_path, rounds, capfd,
                                                                prefect_api):
    import time

    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 5))
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    write_preference_batch(tmp_path / "watch", 100, 3)
    assert "retrain: bootstrapped" in rounds("retrain")  # the first champion: no approval
    write_preference_batch(tmp_path / "watch", 100, 4)
    required = [*PROMOTE, "retrain.approval=required"]
    out = rounds("retrain", more=required)
    assert "retrain: awaiting approval" in out, out[-3000:]
    assert "rlhf approve 2 --reason ... --config" in out and "rlhf reject 2 --reason" in out
    assert _aliases(client) == {CHAMPION: "1", CANDIDATE: "2", "challenger": "2"}
    v2 = client.get_model_version(NAME, "2").tags
    assert v2["rlhf.approval.status"] == "pending" and v2["rlhf.approval.deadline"]
    assert v2["rlhf.register.decision"] == "gate: promote, awaiting approval"

    listed = rlhf_in_process(["runs", "--experiment", "rlhf-test"], capfd,
                             MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db")
    waiting_run = v2["rlhf.parent_run_id"]
    assert f"AWAITING {waiting_run}: candidate v2" in listed.stdout, listed.stdout
    row = next(line for line in listed.stdout.splitlines() if line.startswith(waiting_run))
    assert "AWAITING" in row

    out = rounds("approve", "--reason", "read the side-by-side answers", more=required)
    assert "rlhf-policy v2 approved by" in out and "champion v1 -> v2" in out, out
    assert _aliases(client) == {CHAMPION: "2", PREVIOUS: "1"}
    run_tags = client.get_run(waiting_run).data.tags
    assert run_tags["rlhf.approval.status"] == "approved" and run_tags["rlhf.approval.via"] \
        == "cli" and run_tags["rlhf.approval.reason"] == "read the side-by-side answers"
    # again: nothing moves a second time
    again = rounds("approve", "2", "--reason", "again", more=required)
    assert "approved before this answer: nothing changed" in again
    assert _aliases(client) == {CHAMPION: "2", PREVIOUS: "1"}

    write_preference_batch(tmp_path / "watch", 100, 5)
    assert "retrain: awaiting approval" in rounds("retrain", more=required)
    out = rounds("reject", "--reason", "answers got shorter", more=required)
    assert "v3 rejected by" in out and "champion v2 stays" in out, out
    assert _aliases(client) == {CHAMPION: "2", PREVIOUS: "1", "challenger": "3"}
    assert client.get_model_version(NAME, "3").tags["rlhf.approval.status"] == "rejected"
    nothing = rounds("approve", "--reason", "x", more=required, code=2)
    assert "no candidate waits for approval (champion: v2)" in nothing
    _a_round_nobody_answers_in_time(tmp_path, rounds, client, required)
    expected = sorted([
        ("rlhf.champion.promoted", ""), ("rlhf.champion.approval-requested", "2"),
        ("rlhf.champion.approved", "2"), ("rlhf.champion.approval-requested", "3"),
        ("rlhf.champion.rejected", "3"), ("rlhf.champion.approval-requested", "4"),
        ("rlhf.champion.timed-out", "4")])
    deadline = time.time() + 60  # the server stores events as they come, a moment later
    while _events(prefect_api, since) != expected and time.time() < deadline:
        time.sleep(1)
    assert _events(prefect_api, since) == expected
