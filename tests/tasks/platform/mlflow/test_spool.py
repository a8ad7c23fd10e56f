"""The tracking spool against a store that goes away: writes are kept in order and sent once
when it answers, a new process sends what an earlier one left, the outage limit stops the
stage; and the sample-table tag stays within MLflow's cap."""

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import PERMISSION_DENIED, UNAUTHENTICATED
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

from tasks.pipeline.stages.context import StageContext
from tasks.platform.mlflow.runs import StepLogger
from tasks.platform.mlflow.spool import (
    LoginRefused,
    Spool,
    TrackingOutage,
    bounded,
    spool_for,
    spool_table,
)


class FlakyClient(MlflowClient):
    """A store that is away (every write raises a connection error) while ``down``."""

    def __init__(self, uri):
        super().__init__(uri)
        self.down, self.hung = False, threading.Event()  # hung: calls wait until cleared
        self.released = threading.Event()

    def _away(self):
        if self.hung.is_set():
            self.released.wait(30)
        if self.down:
            raise MlflowException("API request failed with exception ConnectionError")

    def log_batch(self, run_id, *args, **kwargs):
        self._away()
        return super().log_batch(run_id, *args, **kwargs)

    def log_artifact(self, run_id, *args, **kwargs):
        self._away()
        return super().log_artifact(run_id, *args, **kwargs)


@pytest.fixture
def run(tmp_path):
    client = FlakyClient(f"sqlite:///{tmp_path}/m.db")
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    return client, run_id


def steps(client, run_id, key):
    return [m.step for m in client.get_metric_history(run_id, key)]


def test_writes_wait_in_order_and_are_sent_once(run, tmp_path):
    client, run_id = run
    spool = Spool(client, run_id, tmp_path / "spool", retry_s=3600)  # flushed by hand
    log = StepLogger(client, run_id, spool)
    log(1, {"a": 1.0})
    client.down = True
    log(2, {"a": 2.0})
    spool_table(spool, pd.DataFrame([{"x": 1}]), "samples/iter_00002.json")
    log(3, {"a": 3.0})
    assert steps(client, run_id, "a") == [1] and len(spool.pending()) == 3
    assert spool.outage_s() > 0 and not spool.flush()
    client.down = False
    assert spool.flush() and spool.pending() == [] and spool.outage_s() == 0
    log(3, {"a": 9.0})  # already logged through the spool: skipped
    assert steps(client, run_id, "a") == [1, 2, 3]
    assert [a.path for a in client.list_artifacts(run_id, "samples")] == \
        ["samples/iter_00002.json"]
    assert not (tmp_path / "spool" / f"{run_id}.jsonl").exists()


def test_a_stages_spooled_tags_and_tables_wait_for_the_server(run, tmp_path):
    """What the PPO loop writes besides metrics (a health finding's tags and table) waits in
    the spool while the server is away, never stopping the stage, and lands once it is back."""
    client, parent = run
    child = client.create_run(client.get_run(parent).info.experiment_id).info.run_id
    ctx = SimpleNamespace(client=lambda: client, workdir=tmp_path, parent_run_id=parent)
    sc = StageContext(ctx, None, None, child)
    client.down = True
    for flags in ("kl_spike", "kl_spike,entropy_collapse"):
        table = pd.DataFrame([{"detector": d} for d in flags.split(",")])
        for on_parent in (False, True):
            sc.set_tags({"rlhf.health.flags": flags}, parent=on_parent, spooled=True)
            sc.log_table(table, "health.json", parent=on_parent, spooled=True)
    spools = [spool_for(client, r, tmp_path) for r in (child, parent)]
    assert [len(s.pending()) for s in spools] == [4, 4]
    assert "rlhf.health.flags" not in client.get_run(parent).data.tags
    client.down = False
    assert all(s.flush() for s in spools)
    for run_id in (child, parent):
        assert client.get_run(run_id).data.tags["rlhf.health.flags"] == \
            "kl_spike,entropy_collapse"
        table = json.loads(Path(client.download_artifacts(run_id, "health.json",
                                                          str(tmp_path))).read_text())
        assert table["data"] == [["kl_spike"], ["entropy_collapse"]]
    for s in spools:
        s.close()


def test_a_server_that_hangs_does_not_hold_up_the_writes(run, tmp_path):
    client, run_id = run
    spool = Spool(client, run_id, tmp_path / "spool", retry_s=0.01)
    log = StepLogger(client, run_id, spool)
    client.down = True
    log(1, {"a": 1.0})  # refused: spooled, the retries start
    client.hung.set()  # the next retry hangs inside the send
    time.sleep(0.2)
    start = time.perf_counter()
    log(2, {"a": 2.0})
    assert time.perf_counter() - start < 0.1 and len(spool.pending()) == 2
    client.down = False
    client.hung.clear()
    client.released.set()
    assert spool.flush() and steps(client, run_id, "a") == [1, 2]


def test_a_new_process_sends_what_the_spool_kept(run, tmp_path):
    client, run_id = run
    client.down = True
    StepLogger(client, run_id, Spool(client, run_id, tmp_path / "spool", retry_s=3600))(
        1, {"a": 1.0})
    again = Spool(client, run_id, tmp_path / "spool", retry_s=3600)  # after a restart
    assert not again.flush() and again.outage_s() > 0  # still away: the limit counts
    client.down = False
    log = StepLogger(client, run_id, again)  # counts the spooled step as logged
    log(1, {"a": 5.0})
    assert again.flush() and steps(client, run_id, "a") == [1]


def test_past_the_limit_the_stage_stops_with_what_is_kept(run, tmp_path):
    client, run_id = run
    now = [0.0]
    spool = Spool(client, run_id, tmp_path / "spool", retry_s=3600, clock=lambda: now[0])
    client.down = True
    StepLogger(client, run_id, spool)(1, {"a": 1.0})
    now[0] = 5.0
    spool.check(10)  # within the limit: nothing
    spool.kept = "run R keeps the checkpoint of ppo step 4 in /c"
    now[0] = 11.0
    with pytest.raises(TrackingOutage, match="has not answered for 11 s .*outage_limit_s=10"
                                             ".*checkpoint of ppo step 4 in /c and 1 "):
        spool.check(10)


def test_the_table_tag_stays_within_mlflows_cap():
    listed = [{"path": f"samples/iter_{i:05d}.json", "type": "table"} for i in range(400)]
    kept = bounded(listed)
    assert len(json.dumps(kept)) <= MAX_TAG_VAL_LENGTH and kept[-1] == listed[-1]


class Away:
    """A raw client of a server that is away for its first ``fails`` calls."""

    tracking_uri = "http://127.0.0.1:9"  # (the discard port: nothing answers /health)

    def __init__(self, fails: int):
        self.fails, self.calls = fails, 0

    def search_runs(self, *args):
        self.calls += 1
        if self.calls <= self.fails:
            raise MlflowException("API request failed with exception ConnectionError")
        return ["run"]


def test_a_needed_call_waits_for_the_server_then_stops_past_the_limit(tmp_path, caplog):
    from tasks.platform.mlflow.guarded import GuardedClient

    back = GuardedClient(Away(fails=2), 5.0, "parent", tmp_path, poll_s=0.01)
    assert back.search_runs("0") == ["run"] and back.raw.calls == 3
    assert "not answering (search_runs); waiting up to 5 s" in caplog.text
    assert "answers again after" in caplog.text
    gone = GuardedClient(Away(fails=10**6), 0.2, "parent", tmp_path, poll_s=0.01)
    start = time.monotonic()
    with pytest.raises(TrackingOutage, match=r"not answered for 0 s \(tracking.outage_limit_s"
                                             r"=0.2; at search_runs\); run parent keeps"):
        gone.search_runs("0")
    assert time.monotonic() - start < 2
    with pytest.raises(TrackingOutage, match="at downloading"):
        gone.wait_for_server("downloading")  # /health of a server that is not there


class Refusing(Away):
    """A raw client of a server that refuses the login (HTTP 401) from its first call."""

    def search_runs(self, *args):
        self.calls += 1
        raise MlflowException("API request to endpoint failed with error code 401 != 200",
                              error_code=UNAUTHENTICATED)


class Forbidden(Away):
    """A raw client of a server that answers 403 to a read."""

    def search_runs(self, *args):
        raise MlflowException("denied", error_code=PERMISSION_DENIED)


def test_a_refused_login_stops_at_once_with_what_is_kept(run, tmp_path, monkeypatch):
    """A refusal is not waited out: a needed call stops with LoginRefused at once; the
    training loop's writes are spooled and the next checkpoint stops the stage."""
    from tasks.platform.mlflow.guarded import GuardedClient

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    guarded = GuardedClient(Refusing(fails=0), 60.0, "parent", tmp_path, poll_s=0.01)
    with pytest.raises(LoginRefused, match=r"refused user 'alice' \(HTTP 401 Unauthorized.*"
                                           r"at search_runs\); run parent keeps"):
        guarded.search_runs("0")
    assert guarded.raw.calls == 1
    # a 403 on a read is the caller's: the basic-auth app's answer for an alias of a
    # registered model not created yet
    reader = GuardedClient(Forbidden(fails=0), 60.0, "parent", tmp_path, poll_s=0.01)
    with pytest.raises(MlflowException, match="denied"):
        reader.search_runs("0")
    client, run_id = run
    spool = Spool(client, run_id, tmp_path / "spool", retry_s=3600)
    refusal = MlflowException("denied", error_code=PERMISSION_DENIED)
    monkeypatch.setattr(client, "log_batch", lambda *a, **k: (_ for _ in ()).throw(refusal))
    StepLogger(client, run_id, spool)(1, {"a": 1.0})  # kept, the training goes on
    with pytest.raises(LoginRefused, match=r"HTTP 403 Permission denied.*at a checkpoint.* "
                                           r"and 1 tracking records spooled"):
        spool.check(60)
