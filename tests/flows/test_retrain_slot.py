"""The retrain's one-slot limit is keyed by the tracking store and the policy: a retrain of
another store is never blocked; a second retrain of one store (in a flow run here, as
`rlhf serve` runs it) finds the slot held, names the flow run holding it, and `rlhf retrain`
exits 75 (EX_TEMPFAIL) having trained nothing."""

from __future__ import annotations

import threading

from cli.errors import EX_TEMPFAIL
from cli.main import main
from tasks.config.pipeline_config import load_config
from tasks.platform.prefect.prefect_api import slot_holder
from tasks.retrain.round import limit_name, retrain_slot
from tests.shared import TEST_CONFIG


def _cfg(uri: str, *sets: str):
    return load_config(TEST_CONFIG, [f"tracking.tracking_uri={uri}", *sets])


def test_two_stores_have_two_slots_and_one_store_one_from_any_folder(tmp_path, monkeypatch):
    a, b = f"sqlite:///{tmp_path}/a/mlflow.db", f"sqlite:///{tmp_path}/b/mlflow.db"
    assert limit_name(_cfg(a)) != limit_name(_cfg(b))
    assert limit_name(_cfg(a)).startswith("rlhf-retrain-rlhf-policy-")
    monkeypatch.chdir(tmp_path)  # a relative path to the same store: the same slot
    assert limit_name(_cfg("sqlite:///a/mlflow.db")) == limit_name(_cfg(a))
    assert limit_name(_cfg("http://mlflow:5000")) != limit_name(_cfg("http://other:5000"))


def test_a_held_slot_skips_its_store_only_and_the_cli_exits_75_naming_the_holder(
        tmp_path, prefect_api, capsys):
    from prefect import flow

    a = _cfg(f"sqlite:///{tmp_path}/a/mlflow.db", f"retrain.watch_dir={tmp_path}/watch")
    b = _cfg(f"sqlite:///{tmp_path}/b/mlflow.db")
    holding, release = threading.Event(), threading.Event()

    @flow(name="holder", flow_run_name="retrain-holding-the-slot")
    def hold() -> None:
        with retrain_slot(a) as held:
            assert held
            holding.set()
            release.wait(60)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(60)
        with retrain_slot(b) as other:  # another store: free
            assert other
        code = main(["retrain", "--config", str(TEST_CONFIG), "--set",
                     f"tracking.tracking_uri={a.tracking.tracking_uri}", "--set",
                     f"retrain.watch_dir={tmp_path}/watch", "--set",
                     "retrain.gate.min_prompts=16"])  # the test config's 16 held-out prompts
    finally:
        release.set()
        thread.join(60)
    out = capsys.readouterr().out
    assert code == EX_TEMPFAIL
    assert f"the slot {limit_name(a)} is held by flow run 'retrain-holding-the-slot'" in out
    assert "nothing trained" in out
    with retrain_slot(a) as again:  # released with the holder's run
        assert again


def test_a_late_answer_for_a_free_slot_is_asked_again_not_taken_for_a_holder(
        tmp_path, prefect_api, monkeypatch):
    import prefect.concurrency.sync as prefect_sync

    a = _cfg(f"sqlite:///{tmp_path}/a/mlflow.db")
    real, calls = prefect_sync.concurrency, []

    def late_once(*args, **kwargs):  # the first request times out, as on a loaded server
        calls.append(kwargs.get("timeout_seconds"))
        if len(calls) == 1:
            raise TimeoutError("timed out after 15 s")
        return real(*args, **kwargs)

    monkeypatch.setattr(prefect_sync, "concurrency", late_once)
    with retrain_slot(a) as held:
        assert held
    assert calls == [15.0, 15.0]
    monkeypatch.setattr(prefect_sync, "concurrency", real)
    with retrain_slot(a) as again:  # and it was released
        assert again
    assert slot_holder(limit_name(a)).startswith("a holder Prefect cannot name")  # none runs
