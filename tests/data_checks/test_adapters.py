"""Anthropic-HH-style and TL;DR-style samples load into the internal schema and validate."""

import json

import pandas as pd
import pytest

from data_checks.adapters import AdapterError, split_hh
from data_checks.config import DataConfig, DataSource, ValidationConfig
from data_checks.loading import load_table
from data_checks.validate import run_validation
from tests.conftest import make_tokenizer
from tests.shared import write_jsonl

WIDE = ValidationConfig(max_prompt_tokens=64, max_response_tokens=16)
H1 = "\n\nHuman: tell me about cats\n\nAssistant: cats are nice .\n\nHuman: and dogs ?"
HH = [{"chosen": H1 + "\n\nAssistant: dogs are good too .", "rejected": H1 + "\n\nAssistant: no"},
      {"chosen": "\n\nHuman: hello\n\nAssistant: hello , nice sun !",
       "rejected": "\n\nHuman: hello\n\nAssistant: bad"}]
INFO = [{"subreddit": "cats", "title": "my cat", "post": "the cat is nice\nthe sun is good"},
        {"subreddit": "dogs", "title": "rain", "post": "the dogs are bad in the rain"}]
TLDR = [{"info": INFO[0], "summaries": [{"text": " cats are nice"}, {"text": " bad"}],
         "choice": 0},
        {"info": INFO[1], "summaries": [{"text": " sun"}, {"text": " dogs and rain are bad"}],
         "choice": 1}]
TLDR_SFT = [{**INFO[0], "summary": " cats are nice"}, {**INFO[1], "summary": " dogs are bad"}]


def test_hh_split_takes_the_shared_dialogue_as_prompt():
    prompt, chosen, rejected = split_hh(HH[0]["chosen"], HH[0]["rejected"])
    assert prompt == H1 + "\n\nAssistant:"
    assert (chosen, rejected) == (" dogs are good too .", " no")
    with pytest.raises(AdapterError, match="no '"):
        split_hh("\n\nHuman: a", "\n\nHuman: b")


def test_hh_prefix_shared_inside_a_reply_is_not_taken_into_the_prompt():
    prompt, chosen, rejected = split_hh("\n\nHuman: hi\n\nAssistant: sure , cats",
                                        "\n\nHuman: hi\n\nAssistant: sure , dogs")
    assert prompt.endswith("Assistant:") and chosen == " sure , cats"


def test_hh_preferences_sft_and_prompts_load_and_validate(tmp_path):
    path = str(write_jsonl(tmp_path / "hh.jsonl", HH))
    pref = load_table(DataSource(path=path, style="hh"), "preference")
    assert pref["prompt"].iloc[1] == "\n\nHuman: hello\n\nAssistant:"
    sft = load_table(DataSource(path=path, style="hh"), "sft")
    assert sft["response"].tolist() == [" dogs are good too .", " hello , nice sun !"]
    data = DataConfig(sft=DataSource(path=path, style="hh"),
                      preference=DataSource(path=path, style="hh"),
                      prompts=DataSource(path=path, style="hh"))
    report = run_validation(data, make_tokenizer(), WIDE, tmp_path / "out")
    assert report.passed, report.failures
    cleaned = [json.loads(x) for x in (tmp_path / "out" / "preference.jsonl").open()]
    assert cleaned[0]["rejected"] == " no"


def test_hh_from_a_saved_datasets_folder(tmp_path):
    from datasets import Dataset

    Dataset.from_list(HH).save_to_disk(str(tmp_path / "hh"))
    df = load_table(DataSource(path=str(tmp_path / "hh"), format="hf", style="hh"),
                    "preference")
    assert df["chosen"].tolist() == [" dogs are good too .", " hello , nice sun !"]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_tldr_comparisons_and_sft_load_and_validate(tmp_path, suffix):
    if suffix == ".jsonl":
        pref_path = write_jsonl(tmp_path / "cmp.jsonl", TLDR)
    else:  # parquet hands the summaries back as numpy arrays of structs
        pref_path = tmp_path / "cmp.parquet"
        pd.DataFrame(TLDR).to_parquet(pref_path)
    pref = load_table(DataSource(path=str(pref_path), style="tldr"), "preference")
    assert pref["prompt"].iloc[0] == ("SUBREDDIT: r/cats\n\nTITLE: my cat\n\nPOST: the cat is "
                                      "nice\nthe sun is good\n\nTL;DR:")
    assert pref["chosen"].tolist() == [" cats are nice", " dogs and rain are bad"]
    assert pref["rejected"].tolist() == [" bad", " sun"]
    sft_path = str(write_jsonl(tmp_path / "sft.jsonl", TLDR_SFT))
    data = DataConfig(sft=DataSource(path=sft_path, style="tldr"),
                      preference=DataSource(path=str(pref_path), style="tldr"),
                      prompts=DataSource(path=str(pref_path), style="tldr"))
    report = run_validation(data, make_tokenizer(), WIDE, tmp_path / "out")
    assert report.passed, report.failures
    assert (tmp_path / "out" / "prompts.jsonl").read_text().count("TL;DR:") == 2
