"""The retrain gate's scorers (tasks/retrain/gate/stage.py): which
scorer decides, the judge's held-out hash split (which the PPO reward model never sees), and an
external registered pyfunc scorer (``models:/<name>@<alias>``) loaded without changing the
process's MLflow settings."""

from __future__ import annotations

import json
import os

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from pydantic import ValidationError

from rlhf_core.eval.gate import GateRule, held_out_for_judge, pair_key
from tasks.config.pipeline_config import load_config
from tasks.config.sections import GateConfig
from tasks.pipeline.stages.judge_model import judge_split
from tasks.pipeline.stages.records import Artifact, DataRecord
from tasks.platform.mlflow.models import load_pyfunc
from tasks.platform.mlflow.runs import RunContext
from tasks.retrain.gate.stage import _gold_tags, _scores, gate_rule, resolve_scorer, scorer_label
from tests.fake_stage import FakeStageContext
from tests.shared import TEST_CONFIG, length_scorer


def _rows(n):
    return [{"prompt": f"p{i}", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(n)]


@pytest.mark.parametrize("scorer", ["auto", "judge", "judge_model", "reward_model",
                                    "models:/big-rm@prod"])
def test_known_scorers_are_accepted(scorer):
    assert GateConfig(scorer=scorer).scorer == scorer


def test_the_gate_section_carries_the_core_rule_and_its_defaults():
    assert gate_rule(GateConfig()) == GateRule()
    g = GateConfig(min_prompts=5, margin=0.1, confidence=0.9, n_bootstrap=300,
                   max_eos_drop=0.2, max_kl=3.0)
    assert gate_rule(g) == GateRule(5, 0.1, 0.9, 300, 0.2, 3.0)


@pytest.mark.parametrize("scorer", ["gold", "models:/big-rm", "models:/a/1", "runs:/x@y"])
def test_unknown_scorers_are_refused(scorer):
    with pytest.raises(ValidationError, match="retrain.gate.scorer"):
        GateConfig(scorer=scorer)


def test_auto_is_the_gold_judge_where_one_exists_else_the_held_out_judge_model():
    cfg = load_config(TEST_CONFIG)
    assert resolve_scorer(cfg, "demo") == "judge"
    assert resolve_scorer(cfg, "none") == "judge_model"
    ext = load_config(TEST_CONFIG, ["retrain.gate.scorer=models:/big-rm@prod"])
    assert resolve_scorer(ext, "demo") == "models:/big-rm@prod"
    assert scorer_label("judge_model") == "held-out judge reward model"
    assert "models:/big-rm@prod" in scorer_label("models:/big-rm@prod")


def test_judge_split_is_a_stable_hash_share_of_the_pairs():
    rows = _rows(4000)
    held = [r for r in rows if held_out_for_judge(r, 0.2)]
    assert 0.18 < len(held) / len(rows) < 0.22
    assert held == [r for r in reversed(rows) if held_out_for_judge(r, 0.2)][::-1]  # order-free
    assert all(held_out_for_judge(r, 0.5) for r in held)  # a larger share keeps these


def _ctx(tmp_path, uri):
    client = MlflowClient(uri)
    exp = client.create_experiment("gate")
    run = client.create_run(exp)
    return client, RunContext(tracking_uri=uri, experiment_id=exp,
                              parent_run_id=run.info.run_id, workdir=str(tmp_path / "w"),
                              seed=0)


def _data(folder) -> DataRecord:
    return DataRecord(data=Artifact(path=str(folder)), tokenizer=Artifact(path="t"))


def test_judge_split_keeps_the_judges_pairs_from_the_reward_model(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client, ctx = _ctx(tmp_path, uri)
    src = tmp_path / "data"
    src.mkdir()
    rows = _rows(300)
    (src / "preference.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (src / "prompts.jsonl").write_text('{"prompt": "q"}\n')
    cfg = load_config(TEST_CONFIG, ["retrain.gate.judge_fraction=0.25"])
    out = judge_split.fn(ctx, cfg, _data(src))
    read = [json.loads(x) for x in open(f"{out.data.path}/preference.jsonl")]
    held = [json.loads(x) for x in open(out.judge_rows)]
    assert sorted(map(json.dumps, read + held)) == sorted(map(json.dumps, rows))
    assert held and read and not {r["prompt"] for r in read} & {r["prompt"] for r in held}
    assert all(held_out_for_judge(r, 0.25) for r in held)
    assert (src / "preference.jsonl").read_text().count("\n") == 300  # validate's untouched
    assert (tmp_path / "w" / "judge_split" / "data" / "prompts.jsonl").exists()
    assert out.data.uri.endswith("/judge_split/data") and out.tokenizer.path == "t"
    tags = client.get_run(ctx.parent_run_id).data.tags
    assert int(tags["rlhf.judge_split.judge_pairs"]) == len(held)
    assert tags["rlhf.judge_split.batch_pairs_held"] == "0"


@pytest.mark.parametrize("judge_data", ["configured", "all"])
def test_a_batchs_held_out_pairs_train_neither_model_unless_judge_data_all(tmp_path,
                                                                            judge_data):
    """``judge_data: configured``: the held-out pairs of the batch under test are kept from
    the reward model and from the judge that decides on it; ``all``: they train the judge."""
    client, ctx = _ctx(tmp_path, f"sqlite:///{tmp_path}/mlflow.db")
    src = tmp_path / "data"
    src.mkdir()
    configured, batch = _rows(200), [{**r, "prompt": f"b{i}"} for i, r in enumerate(_rows(200))]
    (src / "preference.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in configured + batch))
    cfg = load_config(TEST_CONFIG, [f"retrain.gate.judge_data={judge_data}"])
    keys = [pair_key(r) for r in batch]
    out = judge_split.fn(ctx, cfg, _data(src), keys)
    rm = {pair_key(json.loads(x)) for x in open(f"{out.data.path}/preference.jsonl")}
    judge = {pair_key(json.loads(x)) for x in open(out.judge_rows)}
    held_batch = {k for k, r in zip(keys, batch) if held_out_for_judge(r, 0.2)}
    assert held_batch and not held_batch & rm  # never in the reward model's data
    assert judge - set(keys)  # the configured data's held-out pairs teach the judge
    tags = client.get_run(ctx.parent_run_id).data.tags
    if judge_data == "configured":
        assert not judge & set(keys)
        assert tags["rlhf.judge_split.batch_pairs_held"] == str(len(held_batch))
    else:
        assert held_batch <= judge and tags["rlhf.judge_split.batch_pairs_held"] == "0"


def test_external_scorer_scores_both_sides_and_leaves_mlflow_settings_alone(
        tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client, ctx = _ctx(tmp_path, uri)
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(experiment_id=ctx.experiment_id):
        info = mlflow.pyfunc.log_model(name="scorer", python_model=length_scorer(),
                                       registered_model_name="big-judge")
    client.set_registered_model_alias("big-judge", "prod", info.registered_model_version)
    elsewhere = f"sqlite:///{tmp_path}/other.db"
    mlflow.set_tracking_uri(elsewhere)
    mlflow.set_registry_uri(elsewhere)
    # the process's settings, not its environment (MLFLOW_REGISTRY_URI names the registry
    # that the run's own clients register to, and the scorer is looked up there)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    assert load_pyfunc("models:/big-judge@prod", uri) is not None
    assert mlflow.get_tracking_uri() == elsewhere and mlflow.get_registry_uri() == elsewhere
    samples = {"champion": {"response": ["a", "bb"]}, "challenger": {"response": ["ccc", "d"]}}
    sc = FakeStageContext(load_config(TEST_CONFIG), "gate", tmp_path)
    assert sc.run.tracking_uri == uri
    scores = _scores(sc, "models:/big-judge@prod", samples, ["p", "q"], None, None, None)
    assert scores == {"champion": [1.0, 2.0], "challenger": [3.0, 1.0]}
    assert mlflow.get_tracking_uri() == elsewhere
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)  # a registry apart from the tracking store
    assert load_pyfunc("models:/big-judge@prod", elsewhere) is not None
    assert os.environ["MLFLOW_REGISTRY_URI"] == uri and mlflow.get_registry_uri() == elsewhere


def test_gold_tags_say_what_the_gold_judge_would_have_decided():
    decision = {"promote": True, "figures": {}}
    gold = {"promote": False, "figures": {"diff_mean": -0.1, "ci_low": -0.2, "ci_high": 0.05}}
    tags = _gold_tags(decision, gold)
    assert tags["rlhf.gate.gold.decision"] == "keep"
    assert tags["rlhf.gate.gold.agrees"] == "False"
    assert tags["rlhf.gate.gold.ci_low"] == "-0.2"
