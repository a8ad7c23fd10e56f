"""Conversational data end to end on two chat families (Llama-3 and Qwen2/ChatML styles): the
whole pipeline runs on TRL-format files (messages, implicit-prompt pairs with UltraFeedback
scores as margins, prompt messages), the tokenizer's EOS becomes the template's end-of-turn
token, responses stop there, and the sample tables hold rendered conversations."""

import json

import pytest
import torch
import yaml
from transformers import AutoTokenizer, GenerationConfig

from flows.pipeline import rlhf_pipeline
from tasks.config.pipeline_config import load_config
from tests.families import write_chat_data
from tests.shared import parent_runs, pipeline_stages

HEADER = {"llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
          "qwen2": "<|im_start|>assistant\n"}
EOT = {"llama3": "<|eot_id|>", "qwen2": "<|im_end|>"}

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module", params=["llama3", "qwen2",
                                        pytest.param("llama3-cuda-bf16", marks=CUDA)])
def chat_run(request, tmp_path_factory, family_dir, prefect_api):
    tmp = tmp_path_factory.mktemp(f"chat_{request.param}")
    name, cuda = request.param.split("-")[0], request.param.endswith("cuda-bf16")
    data = {k: {"path": v} for k, v in write_chat_data(tmp).items()}
    model = {"base_model": str(family_dir(name)), "device": "cuda" if cuda else "cpu"}
    if cuda:  # autocast in bf16 over fp32 master weights, as on a real GPU run
        model["precision"] = "bf16"
    cfg = {"seed": 0, "model": model,
           "data": data, "validation": {"max_prompt_tokens": 96, "max_response_tokens": 24},
           "sft": {"epochs": 4, "batch_size": 16, "optim": {"lr": 1.0e-2}},
           "reward": {"epochs": 1, "batch_size": 16, "optim": {"lr": 1.0e-3},
                      "use_margin": True},
           "ppo": {"iterations": 2, "rollout_batch_size": 8, "num_minibatches": 1,
                   "ppo_epochs": 2, "optim": {"lr": 1.0e-3}, "max_new_tokens": 12,
                   "sample_every": 1, "num_samples": 4},
           "eval": {"num_prompts": 16, "max_new_tokens": 12, "num_side_by_side": 4},
           "tracking": {"tracking_uri": f"sqlite:///{tmp}/mlflow.db",
                        "workdir": str(tmp / "runs"), "experiment": "gate",
                        "progress": False, "system_metrics": False}}
    (tmp / "config.yaml").write_text(yaml.safe_dump(cfg))
    rlhf_pipeline(config=load_config(tmp / "config.yaml", []))
    client, (parent,), runs = parent_runs(tmp)
    return name, tmp, client, parent, runs


def test_every_stage_runs_on_conversations(chat_run):
    name, tmp, client, parent, runs = chat_run
    assert parent.info.status == "FINISHED"
    by_stage = {r.data.tags["rlhf.stage"]: r for r in runs if "rlhf.stage" in r.data.tags}
    assert sorted(by_stage) == sorted(pipeline_stages())
    assert all(r.info.status == "FINISHED" for r in by_stage.values())
    tags = by_stage["validate"].data.tags
    assert tags["rlhf.tokenizer.chat.end_of_turn"] == tags["rlhf.tokenizer.eos_token"] == EOT[name]


def test_responses_stop_at_the_end_of_turn_token(chat_run):
    name, tmp, client, parent, _ = chat_run
    workdir = tmp / "runs" / parent.info.run_id
    tok = AutoTokenizer.from_pretrained(workdir / "validate" / "tokenizer")
    eot = tok.convert_tokens_to_ids(EOT[name])
    assert tok.eos_token_id == eot != tok.pad_token_id
    stops = GenerationConfig.from_pretrained(workdir / "ppo" / "policy").eos_token_id
    assert eot in (stops if isinstance(stops, list) else [stops])
    metrics = parent.data.metrics
    print(f"{name}: eval/eos_rate_sft {metrics['eval/eos_rate_sft']:.3f} "
          f"eval/eos_rate_policy {metrics['eval/eos_rate_policy']:.3f}")
    assert metrics["eval/eos_rate_sft"] > 0 and metrics["eval/eos_rate_policy"] >= 0.5


def test_sample_tables_show_rendered_conversations(chat_run):
    name, tmp, client, parent, _ = chat_run
    workdir = tmp / "runs" / parent.info.run_id
    rows = [json.loads(x) for x in (workdir / "validate" / "sft.jsonl").read_text().split("\n")
            if x]
    assert all(r["prompt"].endswith(HEADER[name]) for r in rows)
    assert rows[0]["response"] == "sure , nice"
    ppo_rows = json.loads((workdir / "ppo" / "samples.json").read_text())
    assert ppo_rows and all(r["prompt"].endswith(HEADER[name]) for r in ppo_rows)
    assert any("you are a helpful assistant" in r["prompt"] for r in ppo_rows)
    pair = json.loads((workdir / "validate" / "preference.jsonl").read_text().split("\n")[0])
    assert pair["margin"] == 6.0
