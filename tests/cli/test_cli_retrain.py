"""`rlhf demo-batch`, `rlhf promote`, `rlhf rollback` through the CLI entry point."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

from cli.main import main
from rlhf_core.demo import judge_score
from tasks.platform.mlflow.registry import CHALLENGER, CHAMPION, PREVIOUS
from tasks.platform.mlflow.tags import ALIAS_LOG_TAG
from tests.shared import label_agreement


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_demo_batch_writes_good_and_degraded_pairs(tmp_path, capsys, monkeypatch):
    from tasks.platform.prefect import events
    from tasks.retrain.batches import file_digest

    sent = []
    monkeypatch.setattr(events, "emit", lambda *a: sent.append(a))
    sets = ["--set", f"retrain.watch_dir={tmp_path}/in"]
    assert main(["demo-batch", "--offline", "--n", "300", "--seed", "5", *sets]) == 0
    digest = file_digest(tmp_path / "in" / "batch-5.jsonl")
    out = capsys.readouterr().out
    assert f"(batch digest {digest}; labelled by the demo judge with seed 5)" in out
    # announced as a labelled batch, as an import is: a served retrain starts on it
    (event, resource, name, labels, payload), = sent
    assert (event, resource, name) == ("rlhf.preferences.labelled",
                                       f"rlhf.preferences.{digest}", "batch-5.jsonl")
    assert labels["rlhf.imported_by"] == "import" and payload["seed"] == 5
    # no --seed: the config's seed (the demo's 0 here), not the clock
    assert main(["demo-batch", "--offline", "--n", "10", *sets]) == 0
    assert (tmp_path / "in" / "batch-0.jsonl").exists() and sent[-1][4]["seed"] == 0
    assert main(["demo-batch", "--offline", "--n", "300", "--seed", "5", "--degraded",
                 *sets]) == 0
    good, bad = _rows(tmp_path / "in" / "batch-5.jsonl"), \
        _rows(tmp_path / "in" / "batch-5-degraded.jsonl")
    assert len(good) == len(bad) == 300
    assert label_agreement(good) > 0.7
    ordered = [r for r in bad if judge_score(r["prompt"], r["chosen"])
               != judge_score(r["prompt"], r["rejected"])]
    assert ordered and label_agreement(bad) == 0.0
    assert "degraded" in capsys.readouterr().out


def _registry(tmp_path, n_versions=3):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("x"))
    client.create_registered_model("rlhf-policy")
    for _ in range(n_versions):
        client.create_model_version("rlhf-policy", str(tmp_path), run.info.run_id)
    return client, ["--set", f"tracking.tracking_uri={uri}"]


def _aliases(client):
    model = client.get_registered_model("rlhf-policy")
    return {a: str(v) for a, v in model.aliases.items() if a in (CHAMPION, PREVIOUS)}


def test_promote_and_rollback_move_aliases_and_are_recorded(tmp_path):
    client, sets = _registry(tmp_path)
    assert main(["promote", "1", *sets]) == 0
    assert _aliases(client) == {CHAMPION: "1"}
    client.set_registered_model_alias("rlhf-policy", CHALLENGER, "3")  # a kept challenger
    assert main(["promote", "3", "--reason", "judge says so", *sets]) == 0
    assert _aliases(client) == {CHAMPION: "3", PREVIOUS: "1"}
    # promoted, it is no longer the challenger
    assert CHALLENGER not in client.get_registered_model("rlhf-policy").aliases
    assert main(["rollback", *sets]) == 0
    assert _aliases(client) == {CHAMPION: "1", PREVIOUS: "3"}
    log = [json.loads(x) for x in
           client.get_registered_model("rlhf-policy").tags[ALIAS_LOG_TAG].splitlines()]
    assert [(e["action"], e["champion"], e["before"]) for e in log] == [
        ("promote", "1", None), ("promote", "3", "1"), ("rollback", "1", "3")]
    assert log[1]["reason"] == "judge says so" and log[1]["challenger"] == "removed"
    assert client.get_model_version("rlhf-policy", "1").tags["rlhf.champion_since"] \
        .startswith("rollback")


def test_promote_unknown_version_and_rollback_without_history_fail_cleanly(tmp_path, capsys):
    client, sets = _registry(tmp_path, n_versions=1)
    assert main(["promote", "7", *sets]) == 2
    assert "no version 7" in capsys.readouterr().err
    assert main(["rollback", *sets]) == 2
    assert "previous-champion" in capsys.readouterr().err
    assert _aliases(client) == {}
