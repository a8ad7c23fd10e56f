"""A user's own base model and data files, end to end: a GPT-2-like model whose tokenizer has
no PAD, or uses EOS as PAD (as GPT-2 on the hub does), gets a dedicated pad token, resized
embeddings and a record of both in the run; every stage runs; no judge, so no judge metrics."""

from pathlib import Path

import mlflow
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from flows.pipeline import rlhf_pipeline
from tasks.config.pipeline_config import load_config
from tests.conftest import make_tokenizer
from tests.shared import parent_runs, pipeline_stages, write_config


def save_base_model(out, pad: str):
    """A tiny GPT-2 + tokenizer with PAD missing ("missing") or equal to EOS ("eos")."""
    tok = make_tokenizer(pad=False)
    if pad == "eos":
        tok.pad_token = tok.eos_token
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=1, n_head=2,
                     bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id)
    GPT2LMHeadModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return len(tok), tok.eos_token_id


@pytest.mark.parametrize("pad", ["missing", "eos"])
def test_own_model_without_a_distinct_pad_runs_end_to_end(tmp_path, prefect_api, pad):
    vocab, eos_id = save_base_model(tmp_path / "base", pad)
    base_tok = AutoTokenizer.from_pretrained(tmp_path / "base")
    assert base_tok.pad_token_id in (None, eos_id)  # the situation under test

    rlhf_pipeline(config=load_config(write_config(tmp_path, tmp_path / "base"), []))

    client, (parent,), runs = parent_runs(tmp_path)
    assert parent.info.status == "FINISHED"
    by_stage = {r.data.tags["rlhf.stage"]: r for r in runs if "rlhf.stage" in r.data.tags}
    assert sorted(by_stage) == sorted(pipeline_stages())
    assert all(r.info.status == "FINISHED" for r in by_stage.values())
    assert by_stage["validate"].data.tags["rlhf.tokenizer.pad_added"] == "True"

    workdir = tmp_path / "runs" / parent.info.run_id
    tok = AutoTokenizer.from_pretrained(workdir / "validate" / "tokenizer")
    assert len(tok) == vocab + 1 and tok.pad_token_id == vocab
    assert tok.pad_token_id != tok.eos_token_id == eos_id
    for model in ("sft/model", "ppo/policy"):  # embeddings grown for the new token
        weights = load_file(str(workdir / model / "model.safetensors"))
        assert weights["transformer.wte.weight"].shape[0] == vocab + 1, model
    policy = GPT2LMHeadModel.from_pretrained(workdir / "ppo" / "policy")
    assert policy.config.pad_token_id == vocab and policy.config.eos_token_id == eos_id

    metrics = parent.data.metrics
    assert {"eval/rm_score_sft", "eval/rm_score_policy", "eval/kl_to_ref"} <= metrics.keys()
    assert not [k for k in metrics if k.startswith("eval/judge")]
    version = client.get_model_version_by_alias("rlhf-policy", "champion")  # the first
    assert version.run_id == by_stage["register"].info.run_id
    mlflow.set_tracking_uri(client.tracking_uri)
    model_dir = Path(mlflow.artifacts.download_artifacts(version.source, dst_path=tmp_path / "m"))
    card = (model_dir / "artifacts" / "model_card.md").read_text()  # the policy's own card
    assert str(tmp_path / "base") in card and parent.info.run_id in card
