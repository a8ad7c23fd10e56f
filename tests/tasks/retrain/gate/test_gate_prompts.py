"""tasks/retrain/gate/prompts.py: one rule for whether a retrain can reach its gate's decision
(enough held-out prompts for the paired test), a pure function of the settings and a row count,
worded the same by the commands' check before anything starts and by the round's own."""

from __future__ import annotations

import json

import pytest

from tasks.config.pipeline_config import ConfigError, load_config
from tasks.config.sections import GateConfig
from tasks.retrain.gate.prompts import (
    GateError,
    check_retrainable,
    held_out_rows,
    too_few_prompts,
)
from tests.shared import TEST_CONFIG


def test_the_rule_names_the_setting_to_change():
    gate = GateConfig()  # 200 of the first 256
    assert too_few_prompts(gate, 256, "x") is None and too_few_prompts(gate, 200, "x") is None
    short = too_few_prompts(gate, 128, "data.eval_prompts (e.jsonl)")
    assert short.startswith("retrain gate: 128 held-out prompts (128 in data.eval_prompts "
                            "(e.jsonl), retrain.gate.num_prompts 256) are fewer than the 200")
    assert "give data.eval_prompts (e.jsonl) at least 200 rows" in short
    assert "lower retrain.gate.min_prompts" in short and "\n" not in short
    few = too_few_prompts(GateConfig(num_prompts=150), 1000, "x")
    assert "150 held-out prompts" in few and "raise retrain.gate.num_prompts to at least 200" \
        in few
    assert "set data.eval_prompts" in too_few_prompts(gate, None, "")
    assert "set demo.n_eval to at least 200" in too_few_prompts(gate, 16, "demo.n_eval")
    assert too_few_prompts(GateConfig(min_prompts=8), 16, "demo.n_eval") is None


def test_the_commands_and_the_round_refuse_in_the_same_sentence(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q {i}"}) + "\n" for i in range(128)))
    cfg = load_config(TEST_CONFIG, [f"data.sft.path={path}", f"data.preference.path={path}",
                                    f"data.prompts.path={path}",
                                    f"data.eval_prompts.path={path}"])
    assert held_out_rows(cfg) == (128, f"data.eval_prompts ({path})")
    with pytest.raises(GateError) as before:
        check_retrainable(cfg)
    with pytest.raises(GateError) as inside:
        check_retrainable(cfg, cfg.data)
    assert str(before.value) == str(inside.value)
    assert isinstance(before.value, ConfigError)  # the CLI's usage errors: exit 2
    demo = load_config(TEST_CONFIG)  # the test config's 16 demo prompts
    assert held_out_rows(demo) == (16, "demo.n_eval")
    with pytest.raises(GateError, match="set demo.n_eval to at least 200"):
        check_retrainable(demo)
    check_retrainable(load_config(TEST_CONFIG, ["retrain.gate.min_prompts=16"]))
