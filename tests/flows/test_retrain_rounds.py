"""Two `rlhf retrain` rounds on the tiny config (Prefect's local ephemeral API, MLflow at
tmp_path): a bootstrap that consumes a first batch and keeps the judge's held-out pairs from
its reward model, then a round decided by an external registered scorer (the gold judge's
view recorded beside it) whose reward model trains on the first batch too, although that
file left the watch folder; the lineage tags chain the versions. (Which pairs the judge and
the reward model see when a batch is under test: tests/tasks/retrain/gate/test_gate_scorers.py.)
Then, in this process, a control round (the same retrain on the consumed batches alone: gated,
nothing registered, a new batch left new) and `compare` of two versions by the gate."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from rlhf_core.demo import write_preference_batch
from tests.shared import ROOT, TEST_CONFIG, assert_decision_follows_figures


def _sets(tmp_path) -> list[str]:
    return [f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            f"tracking.workdir={tmp_path}/work", f"retrain.watch_dir={tmp_path}/watch",
            "demo.n_eval=8", "retrain.gate.min_prompts=8", "tracking.system_metrics=false",
            "demo.n_pref=300", "retrain.gate.scorer=judge_model"]


def _rlhf(args: list[str], tmp_path, api: str) -> str:
    """`rlhf ARGS` against the session's Prefect API (no temporary server of its own)."""
    cmd = [sys.executable, "-m", "cli", args[0], "--config", str(TEST_CONFIG)]
    for s in _sets(tmp_path):
        cmd += ["--set", s]
    cmd += args[1:]  # after the defaults above: a later --set wins
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PREFECT_API_URL": api})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def _tags(client, version):
    return client.get_model_version("rlhf-policy", version).tags


def test_two_rounds_held_out_judge_split_external_scorer_cumulative_data_lineage(tmp_path,
                                                                              prefect_api):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    first = write_preference_batch(tmp_path / "watch", 200, 3)  # `rlhf demo-batch --offline`
    assert "bootstrapped" in _rlhf(["retrain"], tmp_path, prefect_api)
    v1 = _tags(client, "1")
    boot = client.get_run(v1["rlhf.parent_run_id"]).data.tags
    assert int(boot["rlhf.judge_split.judge_pairs"]) > 0  # the first RM never saw them
    (digest,) = json.loads(v1["rlhf.trained_on"])
    assert json.loads(v1["rlhf.batch_sources"]) == {digest: "offline"}
    first.unlink()  # consumed, then gone from the folder
    write_preference_batch(tmp_path / "watch", 200, 4)
    out = _rlhf(["retrain", "--set", "retrain.gate.scorer=models:/rlhf-reward-model@challenger"],
                tmp_path, prefect_api)
    assert "retrain: " in out
    # the champion's saved tokenizer reads what the first round's gate tokenized: only the
    # preference file (one chunk, a batch appended) is tokenized again
    assert "validate: tokenized 1 chunk of data; " in out, out[-3000:]
    v2 = _tags(client, "2")
    assert v2["rlhf.gate.scorer"] == "external scorer models:/rlhf-reward-model@challenger"
    run2 = client.get_run(v2["rlhf.parent_run_id"]).data.tags
    assert_decision_follows_figures(run2)  # the held-out judge's decision on its figures
    assert_decision_follows_figures(run2, prefix="rlhf.gate.gold.")  # and the gold judge's
    # the retrain's params are the settings it trained with: a third of ppo.iterations
    params = client.get_run(v2["rlhf.parent_run_id"]).data.params
    ppo_run = client.get_run(v2["rlhf.ppo_run_id"])
    assert params["ppo.iterations"] == ppo_run.data.params["ppo.iterations"] == str(
        max(1, round(int(client.get_run(v1["rlhf.parent_run_id"]).data.params[
            "ppo.iterations"]) / 3)))
    trained = json.loads(v2["rlhf.trained_on"])
    assert len(trained) == 2 and trained[0] == digest  # cumulative: the earlier batch too
    assert v2["rlhf.ancestry"] == "v1 -> v2" and v2["rlhf.started_from"] == "champion v1"
    _control_round_and_compare(tmp_path, client, digest, trained[1])


def _control_round_and_compare(tmp_path, client, first: str, second: str) -> None:
    from flows.retrain import compare, retrain
    from tasks.config.pipeline_config import ConfigError, load_config
    from tasks.platform.mlflow.registry import CHAMPION, RegistryError, alias_version
    from tasks.retrain.batches import file_digest, find_batches

    cfg = load_config(TEST_CONFIG, _sets(tmp_path))
    champion = alias_version(client, "rlhf-policy", CHAMPION).version
    waiting = file_digest(write_preference_batch(tmp_path / "watch", 100, 5))
    out = retrain(config=cfg, control=True)
    assert out.status == "control" and out.decision is not None
    tags = client.get_run(out.run.parent_run_id).data.tags
    assert out.decision.reason == tags["rlhf.gate.reason"]
    assert_decision_follows_figures(tags)
    # the control's reward model trained on the consumed batches, not the waiting one
    assert {b.digest for b in find_batches.fn(cfg).new} == {waiting}
    assert sorted(json.loads(tags["rlhf.trained_on"])) == sorted([first, second])
    assert len(client.search_model_versions("name='rlhf-policy'")) == 2  # nothing registered
    assert alias_version(client, "rlhf-policy", CHAMPION).version == champion
    judged = load_config(TEST_CONFIG, [*_sets(tmp_path), "retrain.gate.scorer=judge"])
    with pytest.raises(RegistryError, match="has no version 9"):
        compare(config=judged, champion="9")
    with pytest.raises(ConfigError, match=f"'{champion}' and 'champion' are both "
                       f"v{champion}: a version compared with itself"):
        compare(config=judged, champion=str(champion))  # the champion against itself
    res = compare(config=judged, champion="1", challenger="2")
    assert (res.champion, res.challenger) == (1, 2) and res.decision.scorer == "gold judge"
    tags = client.get_run(res.run.parent_run_id).data.tags
    # a comparison's record: its own tags, no gate decision of a retrain
    assert not [k for k in tags if k.startswith("rlhf.gate.")]
    better = float(tags["rlhf.compare.ci_low"]) > 0.0 and \
        "guard rail" not in tags["rlhf.compare.reason"]  # the gate's rule on its own figures
    assert tags["rlhf.compare.result"] == ("better" if better else "not better"), tags
    assert tags["rlhf.compare.versions"] == "v2 against v1" and "rlhf.compare.ci_low" in tags
    metrics = client.get_run(res.run.parent_run_id).data.metrics
    assert "compare/better" in metrics and "gate/promote" not in metrics
    assert alias_version(client, "rlhf-policy", CHAMPION).version == champion
