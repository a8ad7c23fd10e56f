"""tasks/retrain/labels/imports.py with MLflow at tmp_path: a labelled file becomes a preference
batch named by its digest (known answers held out, the event emitted), is quarantined for poor
label quality or too few known answers (the quarantined event, where the file went), or, dropped
with malformed rows, is quarantined with the error; a bad labeller among good ones is held back
and named while the others' votes train; a second import does nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tasks.config.pipeline_config import load_config
from tasks.platform.mlflow.tags import COLLECTION_TAG
from tasks.retrain.labels import imports as labels
from tasks.retrain.labels.collect import experiment_for
from tasks.retrain.labels.imports import import_dropped, import_labels, quarantine_batches
from tasks.retrain.records import Batch
from tasks.retrain.store import RECORD
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
                                    f"retrain.watch_dir={tmp_path}/watch",
                                    "collect.quality.min_known_labelled=4"])
    events = []
    monkeypatch.setattr(labels, "emit", lambda *a, **k: events.append(a))
    (tmp_path / "watch").mkdir()
    return cfg, client, record, events, tmp_path / "watch"


def _write(path, record, choose, labeller="ann"):
    rows = [{"id": r["id"], "prompt": r["prompt"], "choice": choose(r), "labeller": labeller}
            for r in record]
    pd.DataFrame(rows).to_json(path, orient="records", lines=True)
    return path


def _known_or_a(r):
    return r["known"] or "a"


def test_good_labels_become_a_batch_without_the_known_pairs(setup):
    cfg, client, record, events, watch = setup
    src = _write(watch / "labelled.jsonl", record, _known_or_a)
    out = import_labels.fn(cfg, str(src), "retrain", run_tags={"rlhf.labels.seed": "7"})
    assert out.status == "imported" and out.counts["known"] == N_KNOWN
    batch = [json.loads(x) for x in open(out.batch)]
    assert len(batch) == N_PAIRS and all(r["chosen"].startswith("a") for r in batch)
    assert not {r["prompt"] for r in batch} & {f"p{i}" for i in range(N_KNOWN)}
    assert not src.exists() and (watch / "imported" / "labelled.jsonl").exists()
    # named first by the digest the lineage records, then by the labelled file's
    assert Path(out.batch).name.startswith(f"labelled-{out.digest}-from-")
    (event, resource, name, labels_, _), = events
    assert event == "rlhf.preferences.labelled" and resource == f"rlhf.preferences.{out.digest}"
    assert labels_["rlhf.imported_by"] == "retrain"
    run = client.get_run(out.run_id)
    assert run.data.tags["rlhf.labels.decision"] == "accepted"
    assert run.data.tags["rlhf.labels.seed"] == "7"  # `rlhf demo-batch`: the judge's seed
    assert run.info.run_name == f"labels-accepted-{run.data.tags['rlhf.labels.batch'][:8]}"
    assert run.data.metrics["labels/known_agreement"] == 1.0
    assert run.data.metrics["labels/known_agreement/ann"] == 1.0
    again = _write(watch / "labelled.jsonl", record, _known_or_a)  # the same bytes again
    assert import_labels.fn(cfg, str(again)).status == "already imported"


def test_labels_that_contradict_the_known_answers_are_quarantined(setup):
    cfg, client, record, events, watch = setup
    src = _write(watch / "reversed.jsonl", record,
                 lambda r: {"a": "b", "b": "a"}[r["known"] or "a"])
    out = import_labels.fn(cfg, str(src))
    assert out.status == "quarantined"
    assert "ann: agreement with the known answers 0.00 on 6 pairs is below 0.75" in out.reason
    assert not src.exists() and not list(watch.glob("labelled-*"))
    assert out.where == f"moved to {watch / 'quarantine' / 'reversed.jsonl'}"
    why = (watch / "quarantine" / "reversed.jsonl.why.txt").read_text()
    assert "known answers 0.00" in why
    run = client.get_run(out.run_id)
    assert run.data.tags["rlhf.labels.decision"] == "quarantined"
    assert run.info.run_name.startswith("labels-quarantined-")
    assert json.loads(run.data.tags["rlhf.labels.held_back"]).keys() == {"ann"}
    (event, _, _, labels_, payload), = events
    assert event == "rlhf.preferences.quarantined" and labels_["rlhf.outcome"] == "quarantined"
    assert payload["reason"] == out.reason
    assert payload["figures"]["labels/known_agreement/ann"] == 0.0


def test_a_labeller_who_skips_and_answers_few_known_pairs_is_not_waved_through(
        setup, tmp_path):
    cfg, client, record, events, watch = setup
    outside = tmp_path / "to_label"
    outside.mkdir()
    known = [r["id"] for r in record if r["known"]][:3]  # 3 known pairs answered, all wrong
    src = _write(outside / "dodged.jsonl", record, lambda r: (
        {"a": "b", "b": "a"}[r["known"]] if r["id"] in known else "skip"))
    out = import_labels.fn(cfg, str(src))
    assert out.status == "quarantined"
    assert "not enough known answers: 3 known pairs answered a or b, fewer than 4" in \
        out.reason
    assert out.reason.startswith("every labeller was held back (ann: skipped 13 of 16 rows")
    # copied from outside the watch folder, and the message says so
    assert src.exists() and (watch / "quarantine" / "dodged.jsonl").exists()
    assert out.where == (f"copied to {watch / 'quarantine' / 'dodged.jsonl'} (the "
                            f"original {src} stays where it was)")
    assert events[0][0] == "rlhf.preferences.quarantined"


def test_a_bad_labeller_is_held_back_and_named_while_the_others_votes_train(setup):
    cfg, client, record, events, watch = setup
    frames = [pd.read_json(_write(watch / f"{n}.jsonl", record, choose, n), lines=True)
              for n, choose in (("ann", _known_or_a), ("bob", _known_or_a),
                                ("eve", lambda r: {"a": "b", "b": "a"}[r["known"] or "b"]))]
    for n in ("ann", "bob", "eve"):
        (watch / f"{n}.jsonl").unlink()
    src = watch.parent / "three.jsonl"
    pd.concat(frames).to_json(src, orient="records", lines=True)
    out = import_labels.fn(cfg, str(src))
    assert out.status == "imported", out.reason
    assert out.held_back == {"eve": "agreement with the known answers 0.00 on 6 pairs is "
                                       "below 0.75"}
    assert "labellers held back, votes dropped: eve (agreement" in out.text
    batch = [json.loads(x) for x in open(out.batch)]
    assert len(batch) == N_PAIRS and all(r["chosen"].startswith("a") for r in batch)
    run = client.get_run(out.run_id)
    assert json.loads(run.data.tags["rlhf.labels.held_back"]).keys() == {"eve"}
    m = run.data.metrics
    assert m["labels/known_agreement/eve"] == 0.0 and m["labels/held_back"] == 1
    # Fleiss' kappa of all three on 16 shared pairs: 10 all "a" (P_i 1), 6 known 2:1 (1/3):
    # P_bar 0.75; "a" 39 of 48 votes: P_e .8125^2 + .1875^2 -> (0.75 - P_e) / (1 - P_e)
    p_e = 0.8125 ** 2 + 0.1875 ** 2
    assert m["labels/kappa"] == pytest.approx((0.75 - p_e) / (1 - p_e))
    assert m["labels/labellers"] == 3


def test_a_dropped_file_with_bad_rows_is_quarantined_and_batches_are_left_alone(setup):
    cfg, _, record, events, watch = setup
    _write(watch / "bad.jsonl", record, lambda r: "maybe" if r["id"].endswith("3") else "a")
    pd.DataFrame([{"prompt": "p", "chosen": "a", "rejected": "b"}]).to_json(
        watch / "pairs.jsonl", orient="records", lines=True)
    (out,) = import_dropped.fn(cfg)
    assert out.status == "refused" and "row 4: choice 'maybe'" in out.reason
    assert (watch / "quarantine" / "bad.jsonl").exists() and (watch / "pairs.jsonl").exists()
    (event, _, _, labels_, payload), = events
    assert event == "rlhf.preferences.quarantined" and labels_["rlhf.outcome"] == "refused"
    assert "row 4: choice 'maybe'" in payload["reason"]


def test_batches_the_data_gate_refused_are_quarantined_with_the_event(setup):
    cfg, _, _, events, watch = setup
    path = watch / "pairs.jsonl"
    pd.DataFrame([{"prompt": "p", "chosen": "", "rejected": "b"}]).to_json(
        path, orient="records", lines=True)
    (moved,) = quarantine_batches(cfg, [Batch(name=path.name, path=str(path), digest="ab12")],
                                  "chosen is empty in row 1")
    assert moved == str(watch.resolve() / "quarantine" / "pairs.jsonl") and not path.exists()
    (event, resource, _, labels_, payload), = events
    assert (event, resource) == ("rlhf.preferences.quarantined", "rlhf.preferences.ab12")
    assert labels_ == {"rlhf.outcome": "refused"}
    assert payload["reason"] == "refused by the data gate: chosen is empty in row 1"


def test_a_pulled_vote_whose_labeller_name_holds_a_line_separator_reads_back(tmp_path):
    """Pull files keep non-ASCII text as it is; a name with U+2028 stays one row."""
    import json

    from tasks.retrain.labels.pull import _pulled

    row = {"id": "p1", "choice": "a", "labeller": "Ann\u2028Lee", "task_id": 3}
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "c-pull-1.jsonl").write_text(
        json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    assert _pulled(tmp_path) == {"p1": [row]}
