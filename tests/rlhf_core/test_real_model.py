"""The real model a package ships: SmolLM2-135M-Instruct's GGUF file as a base model (read once,
cached by digest, saved and reloaded as a plain Hugging Face folder), and its tokenizer and
ChatML template through the data gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import SMOLLM2


def test_a_gguf_file_becomes_a_cached_folder_keyed_by_its_digest(smollm2, monkeypatch):
    from rlhf_core.models import sources

    folder = Path(smollm2)
    gguf = sources.package_file(SMOLLM2)
    marker = json.loads((folder / sources.MARKER).read_text())
    assert marker["sha256"] == sources.file_digest(gguf)
    assert folder.name == f"{gguf.stem}-{marker['sha256'][:16]}"
    assert sources.cached_digest(folder) == marker["sha256"]
    # a second resolution reuses the folder: nothing is converted again
    monkeypatch.setattr(sources, "_convert", lambda *a: pytest.fail("converted again"))
    assert sources.resolve_model_source(SMOLLM2, folder.parent) == str(folder)
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30


def test_the_cached_folder_loads_answers_and_saves_like_any_model(smollm2, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0][ids["input_ids"].shape[1]:])
    model.save_pretrained(tmp_path / "saved")  # a GGUF-loaded model refuses this
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    with torch.no_grad():
        assert torch.equal(again(**ids).logits, model(**ids).logits)


def test_a_model_source_that_cannot_be_used_is_named_with_the_fix(tmp_path):
    from tasks.config.pipeline_config import ConfigError
    from tasks.platform.prefect.preflight import check_model_source

    with pytest.raises(ConfigError, match="no installed Python package 'nope_pkg'"):
        check_model_source("model.base_model", "package:nope_pkg/model.gguf")
    (tmp_path / "a.gguf").write_bytes(b"x")
    (tmp_path / "b.gguf").write_bytes(b"y")
    with pytest.raises(ConfigError, match="2 GGUF files"):
        check_model_source("model.base_model", str(tmp_path))
    check_model_source("model.base_model", str(tmp_path / "a.gguf"))  # a file: accepted


def test_the_real_tokenizer_through_the_data_gate(smollm2, tmp_path):
    """The demo's rows as conversations through SmolLM2's ChatML template: EOS becomes the
    end-of-turn <|im_end|>, PAD is a dedicated new token (its PAD was its EOS), the
    template's <|im_start|> per message is not a doubled BOS, and an over-long prompt is
    dropped, not cut."""
    from data_checks.config import DataConfig, DataSource, ValidationConfig
    from data_checks.validate import ensure_special_tokens, run_validation
    from rlhf_core.demo import DemoSizes, generate_demo_data
    from rlhf_core.models import chat
    from rlhf_core.models.loader import load_tokenizer

    tok = load_tokenizer(smollm2)
    assert tok.pad_token_id == tok.eos_token_id  # as shipped
    record = ensure_special_tokens(tok)
    assert record["pad_added"] and tok.pad_token == "<|pad|>" and len(tok) == 49153
    paths = generate_demo_data(tmp_path / "data", 0, DemoSizes(40, 40, 20, 8, 8), chat=True,
                               system="Answer briefly.")
    with open(paths["prompts"], "a") as fh:  # one request far over the prompt budget
        fh.write(json.dumps({"prompt": [{"role": "user", "content": "cats " * 200}]}) + "\n")
    data = DataConfig(**{k: DataSource(path=str(v)) for k, v in paths.items()})
    report = run_validation(data, tok, ValidationConfig(max_prompt_tokens=64,
                                                        max_response_tokens=24),
                            tmp_path / "out", chat=chat)
    assert report.passed, report.failures
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2 != tok.pad_token_id
    assert report.stats["prompts/n_dropped"] == 1
    row = json.loads((tmp_path / "out" / "sft.jsonl").read_text().splitlines()[0])
    assert row["prompt"].startswith("<|im_start|>system\nAnswer briefly.<|im_end|>\n"
                                    "<|im_start|>user\n")
    assert row["prompt"].endswith("<|im_start|>assistant\n")
