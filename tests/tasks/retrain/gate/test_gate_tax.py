"""The alignment tax at a retrain's gate (tasks/retrain/gate/stage.py): a round's
challenge runs no evaluate, so the gate measures the challenger's tax against the pretrained
base itself, and a challenger over ``eval.tax.budget`` does not win the gate however the
paired test went (the register stage's rule, its reason with the figures); within budget the
test's verdict stands. Measured for real on tiny GPT-2s: the probe's accepted answers are the
base's own greedy answers, which the challenger (another model) does not give."""

from __future__ import annotations

import json

import pytest

from rlhf_core.eval.tax import ProbeItem, answer_probe
from tasks.config.pipeline_config import load_config
from tasks.pipeline.prepare import Prepared
from tasks.pipeline.stages.records import Artifact, DataRecord, ModelRecord, PolicyRecord
from tasks.pipeline.stages.tax import over_budget
from tasks.retrain.gate import stage
from tasks.retrain.gate.champion import Champion
from tasks.retrain.gate.stage import taxed
from tests.fake_stage import FakeStageContext
from tests.shared import TEST_CONFIG

QUESTIONS = [f"{a} {b}" for a in ("tell me about", "please", "hello", "sure the")
             for b in ("cats", "dogs", "rain", "sun", "world")]


def _other_model(out, like, seed: int):
    """Another tiny GPT-2 of the same shape and tokenizer, other weights."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    GPT2LMHeadModel(GPT2Config.from_pretrained(like)).save_pretrained(out)
    AutoTokenizer.from_pretrained(like).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def round_(tmp_path_factory, tiny_model_dir):
    """(cfg, gate inputs) of a round on tiny models; the probe holds the questions the base
    and the challenger answer differently, with the base's answer as the right one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf_core.models.loader import LoadSpec, load_pretrained

    tmp = tmp_path_factory.mktemp("gate_tax")
    challenger = _other_model(tmp / "challenger", tiny_model_dir, 7)
    champion = _other_model(tmp / "champion", tiny_model_dir, 8)  # not the base
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    items = [ProbeItem(q, ("x",)) for q in QUESTIONS]
    answers = {name: answer_probe(AutoModelForCausalLM.from_pretrained(path).eval(), tok,
                                  items, max_new_tokens=3)
               for name, path in (("base", tiny_model_dir), ("challenger", challenger))}
    probe = []
    for q, base, other in zip(QUESTIONS, answers["base"], answers["challenger"]):
        word = next((w for w in base.split() if w.isalpha()), None)
        if word and word not in other.split():
            probe.append({"question": q, "answers": [word]})
    assert len(probe) >= 5, answers
    (tmp / "probe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in probe))
    (tmp / "data").mkdir()
    (tmp / "data" / "eval_prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": q}) + "\n" for q in QUESTIONS[:8]))
    load_pretrained(tiny_model_dir, LoadSpec(), "new_head").save(tmp / "rm")
    cfg = load_config(TEST_CONFIG, [f"model.base_model={tiny_model_dir}",
                                    f"eval.tax.probe={tmp / 'probe.jsonl'}",
                                    "eval.tax.max_new_tokens=3", "eval.max_new_tokens=4",
                                    "retrain.gate.min_prompts=8", "retrain.gate.num_prompts=8"])
    inputs = dict(
        data=DataRecord(data=Artifact(path=str(tmp / "data")),
                        tokenizer=Artifact(path=str(tiny_model_dir))),
        champion=Champion(version="1", sft_run_id="s", ancestry="v1",
                          policy_dir=str(champion), rm_dir=str(tmp / "rm"),
                          sft_dir=str(champion)),
        policy=PolicyRecord(policy=Artifact(path=str(challenger))),
        rm=ModelRecord(model=Artifact(path=str(tmp / "rm"))), reference_dir=str(champion))
    return cfg, inputs, tmp


def _gate(cfg, inputs, tmp, monkeypatch, name):
    """The gate's body, its paired test made to say promote (tiny models win nothing)."""
    real = stage._decide

    def wins(scores, samples, g, seed):
        out = real(scores, samples, g, seed)
        return {**out, "promote": True, "reason": "significant win (test)"}

    monkeypatch.setattr(stage, "_decide", wins)
    sc = FakeStageContext(cfg, "gate", tmp / name)
    # a retrain's prepared base is the champion: the gate must find the pretrained one
    prep = Prepared(ctx=sc.run, data=_data(tmp), base_model=inputs["champion"].policy_dir,
                    tokenizer=inputs["champion"].policy_dir, judge="demo")
    return sc, stage.body(sc, prep, **inputs)


def _data(tmp):
    from data_checks.config import DataConfig, DataSource

    path = DataSource(path=str(tmp / "data" / "eval_prompts.jsonl"))
    return DataConfig(sft=path, preference=path, prompts=path, eval_prompts=path)


def test_a_challenger_over_the_tax_budget_does_not_win_the_gate(round_, monkeypatch):
    cfg, inputs, tmp = round_
    (tmp / "over").mkdir()
    sc, out = _gate(cfg, inputs, tmp, monkeypatch, "over")
    m = out.metrics
    assert m["eval/tax/probe_acc_base"] == 1.0 and m["eval/tax/probe_acc_policy"] == 0.0
    assert m["gate/tax_lost"] == 1.0 and m["gate/promote"] == 0.0
    assert not out.decision.promote
    assert out.decision.reason.startswith(
        "not made champion: its alignment tax is over budget: probe accuracy 0.000 against "
        "the base model's 1.000 (lost 1.000, more than eval.tax.budget 0.10)")
    assert out.decision.reason.endswith("without that: significant win (test)")
    assert sc.parent_tags["rlhf.gate.decision"] == "keep"
    assert sc.parent_metrics["eval/tax/probe_acc_policy"] == 0.0
    assert len(sc.tables["eval/tax_probe.json"]) == len(
        (tmp / "probe.jsonl").read_text().splitlines())
    # register reads the record as it reads evaluate's: the version is tagged over budget
    assert over_budget(m, cfg.eval.tax.budget) in out.decision.reason


def test_within_the_tax_budget_the_gate_s_verdict_stands(round_, monkeypatch):
    cfg, inputs, tmp = round_
    (tmp / "within").mkdir()
    lenient = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={
        "tax": cfg.eval.tax.model_copy(update={"budget": 1.0})})})
    _, out = _gate(lenient, inputs, tmp, monkeypatch, "within")
    assert out.decision.promote and out.decision.reason == "significant win (test)"
    assert out.metrics["gate/tax_lost"] == 1.0


def test_the_tax_veto_at_the_gate_is_the_register_rule():
    tax = {"eval/tax/probe_acc_base": 0.8, "eval/tax/probe_acc_policy": 0.5}
    cfg = load_config(TEST_CONFIG)
    won = {"promote": True, "reason": "win", "figures": {"n_prompts": 200}}
    kept = taxed(won, tax, cfg)
    assert not kept["promote"] and "lost 0.300" in kept["reason"]
    assert kept["figures"] == {"n_prompts": 200, "tax_lost": pytest.approx(0.3)}
    assert taxed(won, {}, cfg) == won  # no base, nothing measured: unchanged
    flagged = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(
        update={"promote_flagged": True})})
    over = taxed(won, tax, flagged)
    assert over["promote"] and "promoted although its alignment tax" in over["reason"]
    from tasks.pipeline.rule import Decision, tax_veto

    again = tax_veto(Decision(promote=True, reason=over["reason"]),
                     over_budget(tax, 0.1), True)  # register's turn: said once
    assert again.reason.count("alignment tax is over budget") == 1
