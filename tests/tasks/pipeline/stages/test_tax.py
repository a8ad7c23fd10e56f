"""The alignment tax in evaluate: the base model's figures kept beside a base known by its
digest and reused (never recomputed for the same inputs), others measured each time."""

from __future__ import annotations

import pytest

from rlhf_core.config import TaxConfig
from rlhf_core.eval.tax import ProbeItem
from tasks.pipeline.stages.tax import measure

PROBE = [ProbeItem("tell me about cats", ("cats",)), ProbeItem("hello world", ("dogs",))]
TEXT = ["the rain is nice .", "sure , cats are good ."]


def test_the_base_models_figures_are_kept_and_reused(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tax = TaxConfig(max_new_tokens=3)
    cache = (tmp_path, {"base": "abc", "precision": "fp32"})
    first, rows = measure(tax, PROBE, TEXT, {"base": model, "policy": model}, tok,
                          base_cache=cache)
    assert len(list((tmp_path / "tax").glob("*.json"))) == 1

    class Broken(type(model)):
        def forward(self, *args, **kwargs):
            raise AssertionError("the base was measured again")

    broken = Broken(model.config).eval()
    again, rows_again = measure(tax, PROBE, TEXT, {"base": broken, "policy": model}, tok,
                                base_cache=cache)
    assert again == first and rows_again == rows
    with pytest.raises(AssertionError, match="measured again"):  # other inputs: measured
        measure(TaxConfig(max_new_tokens=4), PROBE, TEXT, {"base": broken}, tok,
                base_cache=cache)
    with pytest.raises(AssertionError, match="measured again"):  # nothing kept: measured
        measure(tax, PROBE, TEXT, {"base": broken}, tok)


def test_a_bad_pretraining_text_names_data_pretrain_and_the_file(tmp_path):
    from types import SimpleNamespace

    from data_checks.errors import DataError
    from tasks.pipeline.stages.tax import check_tax_inputs, pretrain_chunks

    (tmp_path / "empty.txt").write_text("\n", encoding="utf-8")
    mix = SimpleNamespace(ptx_coef=0.1, ptx_max_tokens=8)
    cfg = SimpleNamespace(eval=SimpleNamespace(tax=TaxConfig(enabled=False)), sft=mix, ppo=mix,
                          model=SimpleNamespace(base_model=""),
                          data=SimpleNamespace(pretrain=SimpleNamespace(
                              path=str(tmp_path / "empty.txt"))))
    with pytest.raises(DataError, match=r"^data\.pretrain .*empty\.txt: file is empty"):
        check_tax_inputs(cfg)
    with pytest.raises(DataError, match=r"^data\.pretrain .*empty\.txt: file is empty"):
        pretrain_chunks(cfg, None, "ppo")
