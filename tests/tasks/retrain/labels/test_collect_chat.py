"""tasks/retrain/labels/collect.py on a conversational run: the policy is sampled on each pool
prompt as the data gate rendered the run's prompts (the data's system message, not the one
the template writes when a conversation has none: the same token ids), a prompt over the
gate's budget is skipped, the labelling file keeps the messages, and a labelled collection
comes back through the import as a batch that the gate accepts in the round's combined
preference file, rendered as the training prompts were."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from data_checks.config import DataConfig, DataSource, ValidationConfig
from data_checks.loading import load_table
from data_checks.tokens import read_tokens, tokens_path
from data_checks.validate import run_validation
from rlhf_core.english import FACTS, all_requests, messages
from rlhf_core.eval.collect import prompt_key
from rlhf_core.models import chat
from tasks.config.pipeline_config import load_config
from tasks.platform.mlflow.tags import COLLECTION_TAG
from tasks.retrain.batches import write_round_pairs
from tasks.retrain.labels import imports
from tasks.retrain.labels.collect import (
    build_record,
    experiment_for,
    prompt_pool,
    rendered_prompts,
    sample_k,
    write_labelling,
)
from tasks.retrain.store import RECORD
from tests.tiny_chat import chat_tokenizer

SYSTEM = "Be brief."
DEFAULT = "You are a helpful AI assistant named Tiny."
# as SmolLM2's: the template writes its own system message when a conversation has none
TEMPLATE = ("{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n" + DEFAULT +
            "<|im_end|>\n' }}{% endif %}"
            "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
            "'<|im_end|>\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
BUDGET = ValidationConfig(max_prompt_tokens=100, max_response_tokens=32)


def _tokenizer():
    tok = chat_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def _save_model(out, tok):
    """A tiny Qwen2-shaped chat model with room for the English prompts' positions."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=512, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    Qwen2ForCausalLM(cfg).save_pretrained(out)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    """A conversational run's data (English requests after SYSTEM's message; one prompt over
    the budget, last), its gate passed, the policy and reward model saved with the gate's
    tokenizer, and a config naming it all -> (cfg, {prompt key: the gate's ids}, dirs)."""
    from rlhf_core.models.loader import LoadSpec, load_pretrained

    tmp = tmp_path_factory.mktemp("chat_collect")
    tok = _tokenizer()
    fits = [r for r in all_requests()
            if len(chat.render_prompt(tok, messages(r, SYSTEM), tokenize=True)) <= 90]
    reqs = fits[::max(1, len(fits) // 12)][:12]
    long = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "cats " * 80}]
    pool = [messages(r, SYSTEM) for r in reqs] + [long]
    right = {r.text: f"The answer is {FACTS[r.question][0]}." for r in reqs}
    data = DataConfig(
        sft=DataSource(path=str(_jsonl(tmp / "sft.jsonl", [
            {"messages": [*messages(r, SYSTEM), {"role": "assistant", "content": right[r.text]}]}
            for r in reqs]))),
        preference=DataSource(path=str(_jsonl(tmp / "preference.jsonl", [
            {"prompt": messages(r, SYSTEM),
             "chosen": [{"role": "assistant", "content": right[r.text]}],
             "rejected": [{"role": "assistant", "content": "I do not know."}]} for r in reqs]))),
        prompts=DataSource(path=str(_jsonl(tmp / "prompts.jsonl",
                                           [{"prompt": p} for p in pool]))),
        eval_prompts=DataSource(path=str(_jsonl(tmp / "eval_prompts.jsonl",
                                                [{"prompt": p} for p in pool[:-1]]))))
    report = run_validation(data, tok, BUDGET, tmp / "gate", chat=chat)
    assert report.passed, report.failures
    assert report.stats["prompts/n_dropped"] == 1  # the long one, last
    ids = read_tokens(tokens_path(tmp / "gate" / "prompts.jsonl")).column("prompt_ids")
    gate_ids = {prompt_key(p): list(i) for p, i in zip(pool, ids.to_pylist())}
    policy = tmp / "policy"
    _save_model(policy, tok)
    tok.save_pretrained(policy)  # the policy keeps the gate's tokenizer (EOS: <|im_end|>)
    spec = LoadSpec()
    load_pretrained(policy, spec, "new_head").save(tmp / "rm")
    config = {
        "model": {"base_model": str(policy), "device": "cpu"},
        "data": {k: {"path": getattr(data, k).path} for k in
                 ("sft", "preference", "prompts", "eval_prompts")},
        "validation": BUDGET.model_dump(),
        "ppo": {"max_new_tokens": 6}, "eval": {"judge": "english"},
        "collect": {"k": 2, "known_pairs": 4, "quality": {"min_known_labelled": 4},
                    "out_dir": str(tmp / "to_label")},
        "retrain": {"watch_dir": str(tmp / "watch")},
        "tracking": {"tracking_uri": f"sqlite:///{tmp}/mlflow.db", "experiment": "chat",
                     "workdir": str(tmp / "runs"), "progress": False},
    }
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    cfg = load_config(tmp / "config.yaml")
    return cfg, gate_ids, {"policy_dir": str(policy), "rm_dir": str(tmp / "rm")}, tmp


def test_the_pool_keeps_the_data_s_conversations_and_its_system_message(chat_run):
    cfg, gate_ids, _, _ = chat_run
    name, pool = prompt_pool(cfg)
    assert name == cfg.data.prompts.path
    assert all(p[0] == {"role": "system", "content": SYSTEM} for p in pool)
    left = {prompt_key(p) for p in pool} - set(gate_ids)  # the one the gate dropped
    assert len(pool) == len(gate_ids) + 1 and len(left) == 1 and "cats cats" in left.pop()


def test_collection_samples_each_prompt_with_the_ids_the_gate_gave_it(chat_run, monkeypatch):
    """The ids fed to generation are the gate's for the same row, the data's system message
    rendered (not the template's default); the prompt over the budget is never sampled."""
    import rlhf_core.eval.evaluate as evaluate

    cfg, gate_ids, dirs, _ = chat_run
    _, pool = prompt_pool(cfg)
    fed, encode = [], evaluate.encode
    monkeypatch.setattr(evaluate, "encode", lambda tok, text: fed.append(encode(tok, text))
                        or fed[-1])
    drawn = sample_k(cfg, dirs, pool, seed=0)
    assert drawn.over_budget == 1 and len(drawn.prompts) == len(pool) - 1
    assert fed == [gate_ids[prompt_key(p)] for p in drawn.prompts for _ in range(cfg.collect.k)]
    text = rendered_prompts(cfg, _tokenizer(), drawn.prompts[:1])[0]
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>") and DEFAULT not in text
    assert len(drawn.responses[0]) == len(drawn.fits[0]) == cfg.collect.k


def test_a_labelled_collection_comes_back_as_a_batch_the_gate_accepts(chat_run, monkeypatch):
    cfg, gate_ids, dirs, tmp = chat_run
    monkeypatch.setattr(imports, "emit", lambda *a, **k: None)
    _, pool = prompt_pool(cfg)
    asked = [p for p in pool if len(p[1]["content"]) < 200]
    answers = [["The answer is Paris.", "I do not know at all.", "Maybe.", "Yes it is."]
               for _ in asked]
    rows, counts = build_record(cfg, "v1-chat", asked, answers, [[0.0, 1.0, 0.5, 0.2]] * len(asked),
                                seed=0, fits=[[True] * 4] * len(asked))
    assert counts["known"] == 4 and all(isinstance(r["prompt"], list) for r in rows)
    said = {a for row in answers for a in row}  # the English judge's pairs: nothing else
    assert all({r["response_a"], r["response_b"]} <= said for r in rows if r["known"])
    paths = write_labelling(tmp / "to_label", "v1-chat", rows, {"policy": "p"})
    assert pd.read_json(paths["jsonl"], lines=True)["prompt"].tolist() == \
        [r["prompt"] for r in rows]  # the messages, in the JSONL and as JSON in the CSV
    assert [json.loads(p) for p in pd.read_csv(paths["csv"])["prompt"]] == \
        [r["prompt"] for r in rows]
    client = MlflowClient(cfg.tracking.tracking_uri)
    run = client.create_run(experiment_for(client, cfg), tags={COLLECTION_TAG: "v1-chat"})
    client.log_dict(run.info.run_id, rows, RECORD)
    client.set_terminated(run.info.run_id)
    table = pd.read_json(paths["jsonl"], lines=True, dtype=False)
    table["choice"] = [r["known"] or "a" for r in rows]
    table.to_json(tmp / "labelled.jsonl", orient="records", lines=True)
    out = imports.import_labels.fn(cfg, str(tmp / "labelled.jsonl"))
    assert out.status == "imported", out.reason
    batch = load_table(DataSource(path=out.batch), "preference")
    assert all(isinstance(p, list) and p[0]["content"] == SYSTEM for p in batch["prompt"])
    # the round's preference file: the configured pairs, then the batch; through the gate
    combined = tmp / "round" / "preference.jsonl"
    combined.parent.mkdir()
    write_round_pairs(combined, cfg.data.preference, [("batch", batch)])
    data = cfg.data.model_copy(update={"preference": DataSource(path=str(combined))})
    report = run_validation(data, _tokenizer(), cfg.validation, tmp / "round" / "gate",
                            chat=chat)
    assert report.passed, report.failures
    assert report.stats["preference/n_dropped"] == 0
    ids = read_tokens(tokens_path(tmp / "round" / "gate" / "preference.jsonl")) \
        .column("prompt_ids").to_pylist()[-len(batch):]
    assert ids == [gate_ids[prompt_key(p)] for p in batch["prompt"]]
