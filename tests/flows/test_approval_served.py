"""A person signs off the champion on a served round, in headless Chromium against a real
Prefect server with its UI, a real MLflow server and `rlhf serve` (``retrain.approval:
required``): a round whose gate says promote suspends with the form and its evidence and no
process of its own while it waits; the form's Approve promotes exactly once; a round rejected
through the form's API (what the UI's Submit calls) keeps the champion; the form and
`rlhf approve` at once promote once; a round left past a short deadline ends "Timed out" and
keeps the champion; each answer's event reaches the server. The gate is told to promote (the
point is the sign-off). Skipped, saying why, where Chromium or Playwright is missing.

``RLHF_UPDATE_SCREENSHOTS=1`` writes the form's picture to docs/img/prefect-approval-form.png."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from mlflow.tracking import MlflowClient

from rlhf_core.demo import write_preference_batch
from tasks.platform.mlflow.registry import CANDIDATE, CHAMPION
from tests import ui
from tests.flows.prefect_procs import ROOT, TERMINAL, wait_run

pytestmark = pytest.mark.skipif(ui.missing() is not None, reason=ui.missing() or "")

NAME = "rlhf-policy"
SETS = ["demo.n_eval=8", "retrain.gate.min_prompts=8", "demo.n_pref=200",
        "retrain.gate.margin=-1000", "retrain.gate.max_kl=1000000", "retrain.gate.max_eos_drop=1",
        "retrain.approval=required"]
SHOT = ROOT / "docs" / "img" / "prefect-approval-form.png"


@dataclass
class Session:
    srv: ui.Served
    page: object
    deployment_id: str
    tmp: Path
    mlflow: MlflowClient
    serve_pid: int
    since: str


def _serve_pid() -> int:
    """`rlhf serve`'s process (a child of this one)."""
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.cmdline()[1:4] == ["-m", "cli", "serve"]:
                return proc.pid
        except psutil.Error:
            continue
    raise AssertionError("no rlhf serve process")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("approval")
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 5))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLHF_APPROVAL_CHECK_S", "3")  # the keeper looks every 3 s
        with ui.served(tmp, [f"retrain.watch_dir={tmp}/watch", *SETS]) as srv, \
                ui.browser() as page:
            dep = str(srv.client.read_deployment_by_name("retrain/test").id)
            s = Session(srv, page, dep, tmp, MlflowClient(srv.mlflow), _serve_pid(), since)
            write_preference_batch(tmp / "watch", 100, 3)
            first = wait_run(srv.client, srv.client.create_flow_run_from_deployment(dep).id,
                             600)  # the first champion: no approval asked
            assert first.state.type.value == "COMPLETED", srv.log.read_text()[-3000:]
            yield s


def _flow_run_processes(pid: int, flow_run_id: str) -> list[int]:
    """Processes under `rlhf serve` that run the flow run (Prefect's runner gives each its
    id in PREFECT__FLOW_RUN_ID)."""
    out = []
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            if proc.environ().get("PREFECT__FLOW_RUN_ID") == flow_run_id and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except psutil.Error:
            continue
    return out


def _alive(pids: set[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            continue
    return out


def _round_until_it_waits(s: Session, seed: int, parameters: dict | None = None):
    """A new batch and a round -> (the flow run suspended, pids that ran it)."""
    write_preference_batch(s.tmp / "watch", 100, seed)
    run = s.srv.client.create_flow_run_from_deployment(s.deployment_id,
                                                       parameters=parameters or {})
    rid, seen, deadline = str(run.id), set(), time.time() + 600
    while time.time() < deadline:
        run = s.srv.client.read_flow_run(rid)
        state = run.state.type.value if run.state else ""
        if state == "RUNNING":
            seen |= set(_flow_run_processes(s.serve_pid, rid))
        if state == "PAUSED" or state in TERMINAL:
            break
        time.sleep(0.5)
    assert run.state.type.value == "PAUSED", (run.state, s.srv.log.read_text()[-3000:])
    return run, seen


def _moves(client: MlflowClient, action: str) -> int:
    import json

    log = client.get_registered_model(NAME).tags.get("rlhf.alias_log", "")
    return [json.loads(x)["action"] for x in log.splitlines() if x].count(action)


def _taken(s: Session, flow_run_id, timeout: float = 120) -> None:
    """The form's answer reached the server: the run leaves Suspended within ``timeout``
    (else the page's text, where the UI says why, instead of a wait for the whole round)."""
    deadline = time.time() + timeout
    while s.srv.client.read_flow_run(flow_run_id).state.name == "Suspended":
        assert time.time() < deadline, ("still Suspended after the form's Submit",
                                        s.page.inner_text("body")[-3000:])
        time.sleep(1)


def _champion(client: MlflowClient) -> str:
    return str(client.get_model_version_by_alias(NAME, CHAMPION).version)


def test_a_round_waits_on_its_form_without_a_process_and_approve_promotes_once(session):
    s = session
    run, seen = _round_until_it_waits(s, 4)
    assert run.state.name == "Suspended"
    assert seen, "no process of the round was seen while it trained"
    suspended, alive = time.time(), _alive(seen)
    while alive and time.time() < suspended + 60:  # its process ends as it suspends
        time.sleep(0.5)
        alive = _alive(seen)
    assert not alive, [psutil.Process(p).cmdline() for p in alive]
    print(f"the round's processes {sorted(seen)} ended {time.time() - suspended:.1f} s after "
          "it suspended")
    assert _flow_run_processes(s.serve_pid, str(run.id)) == []
    assert _champion(s.mlflow) == "1"
    assert str(s.mlflow.get_model_version_by_alias(NAME, CANDIDATE).version) == "2"
    shot = SHOT if os.environ.get("RLHF_UPDATE_SCREENSHOTS") else s.tmp / "form.png"
    form = ui.approval_form(s.page, s.srv, str(run.id), shot)
    for shown in ("Candidate v2 of rlhf-policy against champion v1", "paired win rate",
                  "held-out judge's gain (gold judge)", "KL to the reference", "EOS rate",
                  "health flags: none", "candidate v2 (", "champion v1 (",
                  "compare this round with the champion's", "rlhf approve 2", "Decision",
                  "Reason"):
        assert shown in form, (shown, form)
    compare = s.page.get_by_role("link", name="compare this round with the champion's")
    compare = compare.get_attribute("href")
    ui.answer_form(s.page, "Approve", "the answers read better")
    _taken(s, run.id)
    done = wait_run(s.srv.client, run.id, 600)
    assert done.state.type.value == "COMPLETED", s.srv.log.read_text()[-3000:]
    assert _champion(s.mlflow) == "2" and _moves(s.mlflow, "approve") == 1
    tags = s.mlflow.get_model_version(NAME, "2").tags
    assert (tags["rlhf.approval.status"], tags["rlhf.approval.via"],
            tags["rlhf.approval.reason"]) == ("approved", "prefect-ui", "the answers read better")
    assert tags["rlhf.approval.flow_run_id"] == str(run.id)
    assert "approved" in _artifact(s, run.id, "rlhf-run-summary")
    s.page.goto(compare)  # the form's link: MLflow's compare view of the two rounds
    s.page.get_by_text("Parameters", exact=False).first.wait_for(timeout=60_000)
    s.page.wait_for_timeout(2000)
    shown = s.page.inner_text("body")
    champion_round = s.mlflow.get_model_version(NAME, "1").tags["rlhf.parent_run_id"]
    assert tags["rlhf.parent_run_id"] in shown and champion_round in shown, shown[:2000]


def _artifact(s: Session, flow_run_id, key: str) -> str:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    arts = s.srv.client.read_artifacts(artifact_filter=ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(str(a.data) for a in arts if a.key == key)


def test_a_round_rejected_through_the_forms_api_keeps_the_champion(session):
    s = session
    run, _ = _round_until_it_waits(s, 5)
    assert "Retrain awaiting approval" in _artifact(s, run.id, "rlhf-run-summary")
    s.srv.client.resume_flow_run(run.id, run_input={"decision": "Reject",
                                                    "reason": "shorter answers"})
    done = wait_run(s.srv.client, run.id, 600)
    assert done.state.type.value == "COMPLETED", s.srv.log.read_text()[-3000:]
    assert _champion(s.mlflow) == "2" and _moves(s.mlflow, "approve") == 1
    assert s.mlflow.get_model_version(NAME, "3").tags["rlhf.approval.status"] == "rejected"
    assert "rejected" in _artifact(s, run.id, "rlhf-retrain-decision")


def test_the_form_and_the_cli_at_once_promote_once(session):
    s = session
    run, _ = _round_until_it_waits(s, 6)
    env = {**os.environ, "MLFLOW_TRACKING_URI": s.srv.mlflow, "PREFECT_API_URL": s.srv.api}
    cli = []
    thread = threading.Thread(target=lambda: cli.append(subprocess.run(
        [sys.executable, "-m", "cli", "approve", "4", "--reason", "from the terminal",
         "--config", str(ROOT / "configs" / "test.yaml")], cwd=s.tmp, env=env,
        capture_output=True, text=True, timeout=300)))
    thread.start()
    s.srv.client.resume_flow_run(run.id, run_input={"decision": "Approve",
                                                    "reason": "from the form"})
    thread.join()
    assert cli[0].returncode == 0, cli[0].stdout[-2000:] + cli[0].stderr[-2000:]
    done = wait_run(s.srv.client, run.id, 600)
    assert done.state.type.value == "COMPLETED", s.srv.log.read_text()[-3000:]
    assert _champion(s.mlflow) == "4" and _moves(s.mlflow, "approve") == 2  # v2, then v4
    tags = s.mlflow.get_model_version(NAME, "4").tags
    kept = tags["rlhf.approval.reason"]
    assert kept in ("from the terminal", "from the form")
    # both tell the one answer kept; the round's summary too
    assert "v4 approved by" in cli[0].stdout and f": {kept}" in cli[0].stdout, cli[0].stdout
    summary = _artifact(s, run.id, "rlhf-run-summary")
    assert f": {kept}" in summary and "v4 -> v4" not in summary, summary
    assert "champion v2 -> v4" in summary or "champion v4" in summary, summary


def test_a_round_left_past_its_deadline_ends_timed_out_and_keeps_the_champion(session):
    s = session
    short = {"config": {"retrain": {"approval_timeout_h": 0.008}}}  # about 29 s
    run, _ = _round_until_it_waits(s, 7, short)
    done = wait_run(s.srv.client, run.id, 300)
    assert (done.state.type.value, done.state.name) == ("COMPLETED", "Timed out"), done.state
    assert "timed out (no answer by" in done.state.message and "champion v4 stays" in \
        done.state.message
    assert _champion(s.mlflow) == "4"
    assert s.mlflow.get_model_version(NAME, "5").tags["rlhf.approval.status"] == "timed-out"
    assert CANDIDATE not in s.mlflow.get_registered_model(NAME).aliases


def test_every_answer_was_announced(session):
    s = session
    body = {"filter": {"event": {"prefix": ["rlhf.champion."]}, "occurred": {"since": s.since}},
            "limit": 50}
    expected = {"rlhf.champion.approval-requested": 4, "rlhf.champion.approved": 2,
                "rlhf.champion.rejected": 1, "rlhf.champion.timed-out": 1}
    deadline, counts = time.time() + 60, {}
    while time.time() < deadline:
        found = httpx.post(f"{s.srv.api}/events/filter", json=body, timeout=30).json()["events"]
        counts = {k: sum(e["event"] == k for e in found) for k in expected}
        if counts == expected:
            break
        time.sleep(1)
    assert counts == expected
