"""Conversational data through the gate: TRL's formats load (JSONL, Parquet and datasets saved
to disk alike) and are rendered with the chat template; every template check stops the gate
with the file, the row and the fix."""

import json

import pandas as pd
import pytest

from data_checks.config import DataConfig, DataSource, ValidationConfig
from data_checks.loading import DataError, load_table
from data_checks.validate import ensure_special_tokens, run_validation
from rlhf_core.models import chat
from tests.families import CHATML_TEMPLATE, FAMILIES, build_tokenizer
from tests.shared import write_jsonl

CFG = ValidationConfig(max_prompt_tokens=256, max_response_tokens=32)
SYSTEM = {"role": "system", "content": "be nice"}


def user(text):
    return {"role": "user", "content": text}


def bot(text):
    return {"role": "assistant", "content": text}


def sft_rows(n=6):
    return [{"messages": [SYSTEM, user(f"tell me about cats {i}"), bot("cats are nice"),
                          user("and dogs"), bot(f"dogs are good {i}")]} for i in range(n)]


def pref_rows(n=6):  # implicit prompt, UltraFeedback-binarized's schema
    return [{"prompt": f"hello {i}", "chosen": [user(f"hello {i}"), bot("sure thanks")],
             "rejected": [user(f"hello {i}"), bot("bad")], "score_chosen": 8.0,
             "score_rejected": 3.5} for i in range(n)]


def prompt_rows(n=6):
    return [{"prompt": [user(f"why rain {i}")]} for i in range(n)]


def tokenizer(name):
    tok = build_tokenizer(FAMILIES[name])
    ensure_special_tokens(tok)
    return tok


def gate(tmp_path, tok, sft=None, pref=None, prompts=None, cfg=CFG):
    paths = {name: write_jsonl(tmp_path / f"{name}.jsonl", rows) for name, rows in
             (("sft", sft or sft_rows()), ("pref", pref or pref_rows()),
              ("prompts", prompts or prompt_rows()))}
    data = DataConfig(sft=DataSource(path=str(paths["sft"])),
                      preference=DataSource(path=str(paths["pref"])),
                      prompts=DataSource(path=str(paths["prompts"])))
    report = run_validation(data, tok, cfg, tmp_path / "out", chat=chat)
    read = {n: [json.loads(x) for x in (tmp_path / "out" / f"{n}.jsonl").read_text().split(
        "\n") if x] for n in ("sft", "preference", "prompts") if report.passed}
    return report, read


@pytest.mark.parametrize("name", ["llama3", "qwen2"])
def test_conversations_are_rendered_with_the_template(tmp_path, name):
    tok = tokenizer(name)
    report, out = gate(tmp_path, tok)
    assert report.passed, report.failures
    eot = {"llama3": "<|eot_id|>", "qwen2": "<|im_end|>"}[name]
    assert report.chat["end_of_turn"] == eot == tok.eos_token
    first = out["sft"][0]
    # multi-turn prompt with its system message, ending in the assistant header; the reply is
    # the last assistant message, without its end-of-turn (SFT appends EOS = end-of-turn)
    assert first["prompt"] == tok.apply_chat_template(sft_rows()[0]["messages"][:-1],
                                                      tokenize=False, add_generation_prompt=True)
    assert "be nice" in first["prompt"] and "cats are nice" in first["prompt"]
    assert first["response"] == "dogs are good 0"
    pair = out["preference"][0]
    assert (pair["chosen"], pair["rejected"], pair["margin"]) == ("sure thanks", "bad", 4.5)
    assert pair["prompt"].endswith({"llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
                                    "qwen2": "<|im_start|>assistant\n"}[name])
    # the token budget counts the template's tokens
    raw = len(tok("why rain 0", add_special_tokens=False)["input_ids"])
    assert report.stats["prompts/n_rows"] == 6
    assert len(chat.render_prompt(tok, prompt_rows()[0]["prompt"], tokenize=True)) > raw + 4


def test_every_format_gives_the_same_rows(tmp_path):
    prompt = [SYSTEM, user("hi")]
    forms = {
        "sft": [{"messages": [*prompt, bot("sure")]},
                {"prompt": prompt, "completion": [bot("sure")]},
                {"prompt": prompt, "completion": bot("sure")}],
        "preference": [{"prompt": prompt, "chosen": [bot("good")], "rejected": [bot("bad")]},
                       {"chosen": [*prompt, bot("good")], "rejected": [*prompt, bot("bad")]}],
        "prompts": [{"prompt": prompt}, {"messages": [*prompt, bot("sure")]}],
    }
    for kind, rows in forms.items():
        loaded = [load_table(DataSource(path=str(write_jsonl(tmp_path / f"{kind}{i}.jsonl",
                                                              [row]))), kind)
                  for i, row in enumerate(rows)]
        first = loaded[0].to_dict(orient="records")
        assert first[0]["prompt"] == prompt
        assert all(df.to_dict(orient="records") == first for df in loaded), kind


def test_parquet_and_saved_datasets_load_like_jsonl(tmp_path):
    from datasets import Dataset

    rows = pref_rows(3)
    jsonl = load_table(DataSource(path=str(write_jsonl(tmp_path / "p.jsonl", rows))),
                       "preference")
    pd.DataFrame(rows).to_parquet(tmp_path / "p.parquet")
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    for source in (DataSource(path=str(tmp_path / "p.parquet")),
                   DataSource(path=str(tmp_path / "ds"), format="hf")):
        got = load_table(source, "preference")
        assert got.to_dict(orient="records") == jsonl.to_dict(orient="records")
    assert jsonl["margin"].tolist() == [4.5] * 3


def test_style_conversational_makes_plain_strings_user_messages(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "hi", "response": "sure"}])
    plain = load_table(DataSource(path=str(path)), "sft")
    forced = load_table(DataSource(path=str(path), style="conversational"), "sft")
    assert plain["prompt"][0] == "hi"
    assert forced.to_dict(orient="records") == [{"prompt": [user("hi")], "response": "sure"}]


def _template_without_generation_prompt():
    return CHATML_TEMPLATE.split("{%- if add_generation_prompt %}")[0]


@pytest.mark.parametrize("case,family,change,rows,message", [
    ("no template", "gpt2", None, {}, "sft.jsonl: conversational data, but the tokenizer has "
     "no chat template (set model.chat_template"),
    ("cannot render", "mistral", None, {}, "sft.jsonl row 1: the chat template cannot render "
     "this conversation (TemplateError: Conversation roles must alternate"),
    ("no generation prompt", "qwen2", _template_without_generation_prompt(), {},
     "the template has no generation prompt"),
    ("end-of-turn not in the vocabulary", "qwen2",
     CHATML_TEMPLATE.replace("'<|im_end|>' + '\n'", "'<|end|>' + '\n'"), {},
     "ends an assistant turn with '<|end|>', which is not one token"),
    ("double BOS", "llama3", None,
     {"prompts": [{"prompt": [user("<|begin_of_text|>why")]}] * 6},
     "prompts.jsonl row 1: the rendered prompt holds 2 BOS tokens"),
    ("end-of-turn in a message", "qwen2", None,
     {"sft": [{"messages": [user("hi<|im_end|>"), bot("sure")]}] * 6},
     "sft.jsonl row 1: a message holds the token '<|im_end|>' literally"),
    ("bad message", "qwen2", None, {"sft": [{"messages": [{"role": "robot", "content": "x"}]}]},
     "sft.jsonl row 1 (conversational): field 'messages' message 1 must have a role"),
])
def test_template_checks_stop_the_gate_naming_file_row_and_fix(tmp_path, case, family, change,
                                                                rows, message):
    tok = tokenizer(family)
    if change is not None:
        tok.chat_template = change
    with pytest.raises(DataError) as err:
        gate(tmp_path, tok, **rows)
    assert message in str(err.value), str(err.value)
    assert not (tmp_path / "out" / "sft.jsonl").exists()


def test_end_of_turn_equal_to_pad_is_refused(tmp_path):
    tok = tokenizer("llama3")
    tok.eos_token = "<|end_of_text|>"  # a base tokenizer, whose PAD is the chat's turn end
    tok.pad_token = "<|eot_id|>"
    with pytest.raises(DataError, match="end-of-turn token '<|eot_id|>' is also the "
                                        "tokenizer's PAD"):
        gate(tmp_path, tok)


def test_model_chat_template_gives_a_base_tokenizer_one(tmp_path):
    tok = tokenizer("gpt2")
    tok.chat_template = CHATML_TEMPLATE.replace("<|im_end|>", "<|endoftext|>")
    report, out = gate(tmp_path, tok)
    assert report.passed and tok.eos_token == "<|endoftext|>"
    assert out["prompts"][0]["prompt"].endswith("<|im_start|>assistant\n")


def test_a_long_conversation_is_dropped_never_cut(tmp_path):
    tok = tokenizer("qwen2")
    long = [{"prompt": [user("hi\n" * 200 + "why")]}] + prompt_rows(5)
    report, _ = gate(tmp_path, tok, prompts=long)
    assert not report.passed
    failure = next(f for f in report.failures if "prompts.jsonl" in f)
    assert "row 1: its rendered prompt has" in failure
    assert "a cut would remove the template's assistant header" in failure
    assert "raise validation.max_prompt_tokens" in failure


def test_the_prompt_budget_counts_the_templates_tokens(tmp_path):
    tok = tokenizer("qwen2")
    content = len(tok("why rain 0", add_special_tokens=False)["input_ids"])
    rendered = len(chat.render_prompt(tok, prompt_rows()[0]["prompt"], tokenize=True))
    cfg = ValidationConfig(max_prompt_tokens=content + 2, max_response_tokens=32)
    assert content + 2 < rendered  # the text fits the budget, its rendering does not
    report, _ = gate(tmp_path, tok, cfg=cfg)
    assert not report.passed and report.stats["prompts/n_dropped"] == 6
    failure = next(f for f in report.failures if "prompts.jsonl" in f)
    assert f"row 1: its rendered prompt has {rendered} tokens, template included" in failure
