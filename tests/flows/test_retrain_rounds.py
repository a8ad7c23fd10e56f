"""Three `rlhf retrain` rounds on the tiny config (Prefect's local ephemeral API, MLflow at
tmp_path): a bootstrap that keeps the judge's held-out pairs from its reward model, a round
decided by the held-out judge reward model (the gold judge's view recorded beside it), and a
round decided by an external registered scorer whose reward model trains on the batch of the
round before even though that file left the watch folder; the lineage tags chain versions."""

from __future__ import annotations

import json
import subprocess
import sys

from mlflow.tracking import MlflowClient

from rlhf_core.gate import pair_key
from tasks.common import read_jsonl
from tests.shared import ROOT, TEST_CONFIG


def _rlhf(args: list[str], tmp_path) -> str:
    sets = [f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            f"tracking.workdir={tmp_path}/work", f"retrain.watch_dir={tmp_path}/watch",
            "demo.n_eval=8", "retrain.gate.min_prompts=8", "tracking.system_metrics=false",
            "demo.n_pref=300", "retrain.gate.scorer=judge_model"]
    cmd = [sys.executable, "-m", "flows.cli", args[0], "--config", str(TEST_CONFIG)]
    for s in sets:
        cmd += ["--set", s]
    cmd += args[1:]  # after the defaults above: a later --set wins
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def _tags(client, version):
    return client.get_model_version("rlhf-policy", version).tags


def test_three_rounds_fair_scorers_cumulative_data_and_lineage(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert "bootstrapped" in _rlhf(["retrain"], tmp_path)
    boot = client.get_run(_tags(client, "1")["rlhf.parent_run_id"]).data.tags
    assert int(boot["rlhf.judge_split.judge_pairs"]) > 0  # the first RM never saw them
    _rlhf(["demo-batch", "--offline", "--n", "200", "--seed", "3"], tmp_path)
    _rlhf(["retrain"], tmp_path)
    v2 = _tags(client, "2")
    assert v2["rlhf.gate.scorer"] == "held-out judge reward model"
    run2 = client.get_run(v2["rlhf.parent_run_id"]).data.tags
    assert run2["rlhf.gate.scorer_id"] == "judge_model"
    assert run2["rlhf.gate.gold.decision"] in ("promote", "keep")
    # the judge that decided learned nothing from the batch it judged (judge_data:
    # configured); the batch's held-out pairs trained neither the judge nor the RM
    split = tmp_path / "work" / v2["rlhf.parent_run_id"] / "judge_split" / "data"
    batch = {pair_key(r) for r in read_jsonl(tmp_path / "watch" / "batch-3.jsonl")}
    judge_pairs = {pair_key(r) for r in read_jsonl(split / "judge_preference.jsonl")}
    rm_pairs = {pair_key(r) for r in read_jsonl(split / "preference.jsonl")}
    held = int(run2["rlhf.judge_split.batch_pairs_held"])
    assert judge_pairs and not judge_pairs & batch and held > 0
    assert len(batch - rm_pairs) >= held  # those held out are missing from the RM's data
    first = json.loads(v2["rlhf.trained_on"])
    assert len(first) == 1 and json.loads(v2["rlhf.batch_sources"]) == {first[0]: "offline"}
    (tmp_path / "watch" / "batch-3.jsonl").unlink()  # consumed, then gone from the folder
    _rlhf(["demo-batch", "--offline", "--n", "200", "--seed", "4"], tmp_path)
    out = _rlhf(["retrain", "--set", "retrain.gate.scorer=models:/rlhf-reward-model@challenger"],
                tmp_path)
    assert "retrain: " in out
    v3 = _tags(client, "3")
    assert v3["rlhf.gate.scorer"] == "external scorer models:/rlhf-reward-model@challenger"
    trained = json.loads(v3["rlhf.trained_on"])
    assert len(trained) == 2 and trained[0] == first[0]  # cumulative: the earlier batch too
    # the chain of champions v3 descends from: v2 only if the gate promoted it
    via = "v1 -> v2" if run2["rlhf.gate.decision"] == "promote" else "v1"
    assert v3["rlhf.ancestry"] == f"{via} -> v3"
    assert v3["rlhf.started_from"] == f"champion {via.split()[-1]}"
