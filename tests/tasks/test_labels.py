"""tasks/champion/labels.py with MLflow at tmp_path: a labelled file becomes a preference batch
(known answers held out, the event emitted), is quarantined for poor label quality, or, dropped
with malformed rows, is quarantined with the error; a second import does nothing."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from flows.config import load_config
from tasks.champion import labels
from tasks.champion.collect import RECORD, experiment_for
from tasks.champion.labels import import_dropped, import_labels
from tasks.tracking.tags import COLLECTION_TAG
from tests.shared import TEST_CONFIG

N_KNOWN, N_PAIRS = 6, 10


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow store with one collection's record (creating a store costs seconds)."""
    tmp = tmp_path_factory.mktemp("labels")
    uri = f"sqlite:///{tmp}/mlflow.db"
    cfg = load_config(TEST_CONFIG, [f"tracking.tracking_uri={uri}"])
    client = MlflowClient(uri)
    run = client.create_run(experiment_for(client, cfg), tags={COLLECTION_TAG: "v1-abc"})
    record = [{"id": f"v1-abc-{i:04d}", "prompt": f"p{i}", "response_a": f"a{i}",
               "response_b": f"b{i}", "known": ("a" if i % 2 else "b") if i < N_KNOWN else None,
               "rm_a": float(i % 3), "rm_b": 1.0} for i in range(N_KNOWN + N_PAIRS)]
    client.log_dict(run.info.run_id, record, RECORD)
    client.set_terminated(run.info.run_id)
    return uri, client, record


@pytest.fixture()
def setup(store, tmp_path, monkeypatch):
    uri, client, record = store
    cfg = load_config(TEST_CONFIG, [f"tracking.tracking_uri={uri}",
                                    f"retrain.watch_dir={tmp_path}/watch"])
    events = []
    monkeypatch.setattr(labels, "emit", lambda *a, **k: events.append(a))
    (tmp_path / "watch").mkdir()
    return cfg, client, record, events, tmp_path / "watch"


def _write(path, record, choose):
    rows = [{"id": r["id"], "prompt": r["prompt"], "choice": choose(r), "labeller": "ann"}
            for r in record]
    pd.DataFrame(rows).to_json(path, orient="records", lines=True)
    return path


def _known_or_a(r):
    return r["known"] or "a"


def test_good_labels_become_a_batch_without_the_known_pairs(setup):
    cfg, client, record, events, watch = setup
    src = _write(watch / "labelled.jsonl", record, _known_or_a)
    out = import_labels.fn(cfg, str(src), "retrain")
    assert out["status"] == "imported" and out["counts"]["known"] == N_KNOWN
    batch = [json.loads(x) for x in open(out["batch"])]
    assert len(batch) == N_PAIRS and all(r["chosen"].startswith("a") for r in batch)
    assert not {r["prompt"] for r in batch} & {f"p{i}" for i in range(N_KNOWN)}
    assert not src.exists() and (watch / "imported" / "labelled.jsonl").exists()
    (event, resource, name, labels_, _), = events
    assert event == "rlhf.preferences.labelled" and resource == f"rlhf.preferences.{out['digest']}"
    assert labels_["rlhf.imported_by"] == "retrain"
    run = client.get_run(out["run_id"])
    assert run.data.tags["rlhf.labels.decision"] == "accepted"
    assert run.data.metrics["labels/known_agreement"] == 1.0
    assert run.data.metrics["labels/known_agreement/ann"] == 1.0
    again = _write(watch / "labelled.jsonl", record, _known_or_a)  # the same bytes again
    assert import_labels.fn(cfg, str(again))["status"] == "already imported"


def test_labels_that_contradict_the_known_answers_are_quarantined(setup):
    cfg, client, record, events, watch = setup
    src = _write(watch / "reversed.jsonl", record,
                 lambda r: {"a": "b", "b": "a"}[r["known"] or "a"])
    out = import_labels.fn(cfg, str(src))
    assert out["status"] == "quarantined" and not events
    assert "agreement with the known answers 0.00 on 6 pairs is below 0.6" in out["reason"]
    assert not src.exists() and not list(watch.glob("labelled-*"))
    why = (watch / "quarantine" / "reversed.jsonl.why.txt").read_text()
    assert "known answers 0.00" in why
    tags = client.get_run(out["run_id"]).data.tags
    assert tags["rlhf.labels.decision"] == "quarantined"


def test_a_dropped_file_with_bad_rows_is_quarantined_and_batches_are_left_alone(setup):
    cfg, _, record, events, watch = setup
    _write(watch / "bad.jsonl", record, lambda r: "maybe" if r["id"].endswith("3") else "a")
    pd.DataFrame([{"prompt": "p", "chosen": "a", "rejected": "b"}]).to_json(
        watch / "pairs.jsonl", orient="records", lines=True)
    (out,) = import_dropped.fn(cfg)
    assert out["status"] == "refused" and "row 4: choice 'maybe'" in out["reason"]
    assert (watch / "quarantine" / "bad.jsonl").exists() and (watch / "pairs.jsonl").exists()
    assert not events
