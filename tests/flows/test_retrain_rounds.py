"""Two `rlhf retrain` rounds on the tiny config (Prefect's local ephemeral API, MLflow at
tmp_path): a bootstrap that consumes a first batch and keeps the judge's held-out pairs from
its reward model, then a round decided by an external registered scorer (the gold judge's
view recorded beside it) whose reward model trains on the first batch too, although that
file left the watch folder; the lineage tags chain the versions. (Which pairs the judge and
the reward model see when a batch is under test: tests/tasks/test_gate_scorers.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

from mlflow.tracking import MlflowClient

from rlhf_core.demo import write_preference_batch
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


def test_two_rounds_held_out_judge_split_external_scorer_cumulative_data_lineage(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    first = write_preference_batch(tmp_path / "watch", 200, 3)  # `rlhf demo-batch --offline`
    assert "bootstrapped" in _rlhf(["retrain"], tmp_path)
    v1 = _tags(client, "1")
    boot = client.get_run(v1["rlhf.parent_run_id"]).data.tags
    assert int(boot["rlhf.judge_split.judge_pairs"]) > 0  # the first RM never saw them
    (digest,) = json.loads(v1["rlhf.trained_on"])
    assert json.loads(v1["rlhf.batch_sources"]) == {digest: "offline"}
    first.unlink()  # consumed, then gone from the folder
    write_preference_batch(tmp_path / "watch", 200, 4)
    out = _rlhf(["retrain", "--set", "retrain.gate.scorer=models:/rlhf-reward-model@challenger"],
                tmp_path)
    assert "retrain: " in out
    v2 = _tags(client, "2")
    assert v2["rlhf.gate.scorer"] == "external scorer models:/rlhf-reward-model@challenger"
    run2 = client.get_run(v2["rlhf.parent_run_id"]).data.tags
    assert run2["rlhf.gate.gold.decision"] in ("promote", "keep")
    trained = json.loads(v2["rlhf.trained_on"])
    assert len(trained) == 2 and trained[0] == digest  # cumulative: the earlier batch too
    assert v2["rlhf.ancestry"] == "v1 -> v2" and v2["rlhf.started_from"] == "champion v1"
