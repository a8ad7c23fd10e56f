"""`rlhf demo-batch`, `rlhf promote`, `rlhf rollback` through the CLI entry point; a config
that cannot be retrained refused by `rlhf retrain`, `rlhf collect` and `rlhf demo-batch` before
anything starts; demo-batch labelling with the config's own gold judge."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from cli.main import main
from rlhf_core.demo import judge_score
from tasks.platform.mlflow.registry import CHALLENGER, CHAMPION, PREVIOUS
from tasks.platform.mlflow.tags import ALIAS_LOG_TAG
from tests.shared import label_agreement

ROOT = Path(__file__).resolve().parents[2]


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


def _nothing_starts(monkeypatch):
    """Any server check, flow or model load after the config's own checks fails the test."""
    import cli.retrain as commands

    def started(*_a, **_k):
        raise AssertionError("the command went past its config checks")

    monkeypatch.setattr(commands, "_preflight", started)
    monkeypatch.setattr(commands, "check_label_studio", started)


@pytest.mark.parametrize("command", [["retrain"], ["collect"], ["demo-batch"],
                                     ["demo-batch", "--offline"]])
def test_a_config_that_cannot_be_retrained_is_refused_in_one_sentence(command, tmp_path,
                                                                       capsys, monkeypatch):
    """The demo config with 128 held-out prompts (the paired test needs 200): exit 2 and one
    line naming the setting, before any server check, flow or file."""
    _nothing_starts(monkeypatch)
    code = main([*command, "--set", "demo.n_eval=128", "--set",
                 f"retrain.watch_dir={tmp_path}/watch", "--set",
                 f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert err == ("rlhf: retrain gate: 128 held-out prompts (128 in demo.n_eval, "
                   "retrain.gate.num_prompts 256) are fewer than the 200 its paired test needs "
                   "(retrain.gate.min_prompts); set demo.n_eval to at least 200 or lower "
                   "retrain.gate.min_prompts")
    assert not list(tmp_path.iterdir())  # no store, no batch, nothing


def test_a_data_config_s_refusal_names_its_held_out_file(tmp_path, capsys, monkeypatch):
    _nothing_starts(monkeypatch)
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q {i}"}) + "\n" for i in range(128)))
    sets = [x for k in ("sft", "preference", "prompts", "eval_prompts")
            for x in ("--set", f"data.{k}.path={path}")]
    assert main(["retrain", *sets]) == 2
    err = capsys.readouterr().err.strip()
    assert f"give data.eval_prompts ({path}) at least 200 rows" in err and "\n" not in err


ENGLISH = ROOT / "configs" / "smollm2.yaml"


def _english_collection(folder):
    """A labelling file as `rlhf collect` writes it for the English task: conversations, and
    pairs of a right answer that keeps the instruction against a wrong one that breaks it."""
    from rlhf_core.english import FACTS, all_requests, messages

    rows = []
    for i, req in enumerate(all_requests()[:60]):
        good, bad = f"The answer is {FACTS[req.question][0]}.", "Hello there! I like trains."
        a, b = (good, bad) if i % 2 else (bad, good)
        rows.append({"id": f"v1-x-{i:04d}", "prompt": messages(req), "response_a": a,
                     "response_b": b, "choice": "", "labeller": ""})
    path = folder / "v1-x.jsonl"
    pd.DataFrame(rows).to_json(path, orient="records", lines=True)
    return path, ["a" if i % 2 else "b" for i in range(len(rows))]


def test_demo_batch_labels_with_the_config_s_gold_judge(tmp_path, capsys, monkeypatch):
    """configs/smollm2.yaml (eval.judge: english): the English judge labels the champion's
    answers (the demo's judge, reading made-up words, would be near a coin flip on them)."""
    import flows.collect
    from tasks.retrain.records import CollectResult, LabelImport

    monkeypatch.setattr("cli.retrain._preflight", lambda config: None)
    path, better = _english_collection(tmp_path)
    imported = []
    monkeypatch.setattr(flows.collect, "collect_flow", lambda config: CollectResult(
        collection="v1-x", run_id="r", policy="p/1", paths={"jsonl": str(path)}, counts={}))
    monkeypatch.setattr(flows.collect, "label_import", lambda config, path, labelling_seed:
                        imported.append(path) or LabelImport(status="imported", file=path))
    assert main(["demo-batch", "--config", str(ENGLISH), "--seed", "3"]) == 0
    assert "labelled by the gold judge 'english' with seed 3" in capsys.readouterr().out
    labelled = pd.read_json(imported[0], lines=True)
    agree = sum(c == b for c, b in zip(labelled["choice"], better)) / len(better)
    assert agree > 0.95 and set(labelled["labeller"]) == {"gold-judge"}
    from tasks.pipeline.judge import gold_judge  # what it labelled with before

    demo = gold_judge("demo").label(labelled.to_dict("records"), 3)
    assert sum(c == b for c, b in zip(demo, better)) / len(better) < 0.8


@pytest.mark.parametrize("sets, needle", [
    (["eval.judge=none"], "eval.judge resolves to none"),
    ([], "--offline writes the demo's made-up pairs"),
])
def test_demo_batch_without_a_fitting_judge_is_refused(sets, needle, tmp_path, capsys,
                                                       monkeypatch):
    _nothing_starts(monkeypatch)
    args = ["demo-batch", "--config", str(ENGLISH), *[x for s in sets for x in ("--set", s)]]
    assert main([*args, *([] if sets else ["--offline"])]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err
