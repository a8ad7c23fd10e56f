"""A corpus of distinct bad inputs: each stops the data gate with its own message (naming the
file and the line/row/field, or the failed expectation), and nothing is written for training."""

import bz2
import gzip
import json
import os
from pathlib import Path

import pandas as pd
import pytest

from data_checks.config import DataConfig, DataSource, ValidationConfig
from data_checks.loading import DataError
from data_checks.validate import run_validation
from tests.conftest import make_tokenizer
from tests.shared import PREF, PROMPTS, SFT, write_jsonl

CFG = ValidationConfig(max_prompt_tokens=8, max_response_tokens=8)
LONG = "cats " * 20
HH_OK = "\n\nHuman: tell me about cats\n\nAssistant:"
TLDR_INFO = {"subreddit": "cats", "title": "my cat", "post": "the cat is nice"}


def text(content: str | bytes, suffix: str):
    def write(tmp):
        path = tmp / f"bad{suffix}"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return DataSource(path=str(path))
    return write


def rows(data: list, **source):
    def write(tmp):
        return DataSource(path=str(write_jsonl(tmp / "bad.jsonl", data)), **source)
    return write


def frame(df: pd.DataFrame, suffix: str, **source):
    def write(tmp):
        path = tmp / f"bad{suffix}"
        df.to_csv(path, index=False) if suffix == ".csv" else df.to_parquet(path)
        return DataSource(path=str(path), **source)
    return write


def hf_dict(tmp):
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_list(SFT)}).save_to_disk(str(tmp / "ds"))
    return DataSource(path=str(tmp / "ds"), format="hf", split="test")


# (case id, which source it replaces, writer, expected message)
CASES = [
    # malformed files: DataError naming the file and the line / row / column
    ("jsonl_broken_line", "sft", text('{"prompt": "a", "response": "b"}\n{"prompt": "a",\n',
                                      ".jsonl"), "line 2: invalid JSON"),
    ("jsonl_line_not_object", "sft", text('[1, 2]\n', ".jsonl"), "line 1: expected a JSON object"),
    ("empty_file", "sft", text("", ".jsonl"), "file is empty"),
    ("blank_lines_only", "prompts", text("\n\n  \n", ".jsonl"), "no rows"),
    ("missing_column", "sft", rows([{"prompt": "a"}]), "missing column 'response'"),
    ("int_field", "sft", rows([{"prompt": 3, "response": "b"}]),
     "row 1: field 'prompt' must be a string, got int"),
    ("object_field", "preference", rows([{**PREF[0], "chosen": {"text": "a"}}]),
     "field 'chosen' must be a string, got dict"),
    ("bool_field_row_2", "sft", rows([SFT[0], {"prompt": "a", "response": True}]),
     "row 2: field 'response' must be a string, got bool"),
    ("latin1_jsonl", "sft", text(b'{"prompt": "caf\xe9", "response": "b"}\n', ".jsonl"),
     "line 1: not valid UTF-8 (byte 0xe9 at column 16)"),
    ("latin1_jsonl_line_3", "sft", text(b'{"prompt": "a", "response": "b"}\n' * 2
                                        + b'{"prompt": "x", "response": "\xe9t\xe9"}\n', ".jsonl"),
     "line 3: not valid UTF-8 (byte 0xe9 at column 30)"),
    ("bad_utf8_csv", "sft", text(b"prompt,response\n\xff\xfe,x\n", ".csv"),
     "line 2: not valid UTF-8 (byte 0xff at column 1)"),
    ("ragged_csv", "sft", text("prompt,response\na,b\nc,d,e,f\n", ".csv"),
     "cannot read as csv"),
    ("corrupt_parquet", "sft", text(b"PAR1 this is not parquet", ".parquet"),
     "cannot read as parquet"),
    ("parquet_int_column", "prompts", frame(pd.DataFrame({"prompt": [1, 2]}), ".parquet"),
     "row 1: field 'prompt' must be a string, got int64"),
    ("missing_file", "sft", lambda tmp: DataSource(path=str(tmp / "nope.jsonl")),
     "file not found"),
    ("column_map_to_absent_column", "sft",
     frame(pd.DataFrame({"question": ["a"], "answer": ["b"]}), ".csv",
           column_map={"q": "prompt", "answer": "response"}),
     "missing column 'prompt' (found: question, response)"),
    ("hf_unknown_split", "sft", hf_dict, "no split 'test' (found: ['train'])"),
    ("hf_missing_dataset", "sft",
     lambda tmp: DataSource(path=str(tmp / "no_such_dataset"), format="hf"),
     "no_such_dataset: file not found"),  # a local path is never sent to the hub
    ("hh_without_assistant_turn", "preference",
     rows([{"chosen": "\n\nHuman: hi", "rejected": "\n\nHuman: hello"}], style="hh"),
     "row 1 (hh style): transcript has no"),
    ("hh_no_shared_dialogue", "preference",
     rows([{"chosen": "\n\nHuman: a\n\nAssistant: x", "rejected": "\n\nHuman: b\n\nAssistant: y"}],
          style="hh"), "chosen and rejected share no dialogue"),
    ("tldr_choice_out_of_range", "preference",
     rows([{"info": TLDR_INFO, "summaries": [{"text": "a"}, {"text": "b"}], "choice": 2}],
          style="tldr"), "row 1 (tldr style): field 'choice' must be 0 or 1, got 2"),
    ("tldr_one_summary", "preference",
     rows([{"info": TLDR_INFO, "summaries": [{"text": "a"}], "choice": 0}], style="tldr"),
     "field 'summaries' must hold two summaries"),
    ("tldr_post_missing", "preference",
     rows([{"info": {"subreddit": "a", "title": "b"}, "summaries": [{"text": "a"}, {"text": "b"}],
            "choice": 0}], style="tldr"), "field 'info.post' missing"),
    ("margin_not_a_number", "preference",
     rows([{**PREF[0], "margin": "big"}, {**PREF[1], "margin": 1}]),
     "column 'margin' must hold finite numbers; 1 rows do not: rows 1 (e.g. 'big')"),
    ("margin_infinite_in_csv", "preference",
     frame(pd.DataFrame([{**PREF[0], "margin": "1.5"}, {**PREF[1], "margin": "inf"}]), ".csv"),
     "rows 3 (e.g. 'inf')"),
    ("margin_nan_and_missing", "preference",
     rows([{**PREF[0], "margin": float("nan")}, PREF[1]]), "2 rows do not: rows 1, 2"),
    ("csv_duplicate_columns", "sft", text("prompt,response,response\na,b,c\n", ".csv"),
     "duplicate column names in the header: response"),
    ("column_map_onto_existing_column", "sft",
     frame(pd.DataFrame({"prompt": ["a"], "question": ["q"], "response": ["b"]}), ".csv",
           column_map={"question": "prompt"}), "after column_map, more than one column is"),
    ("unknown_extension", "sft", text("prompt\tresponse\n", ".tsv"),
     "unknown data file type"),
    ("gz_not_gzip", "sft", text(b"not gzip at all", ".jsonl.gz"), "cannot decompress as .gz"),
    ("json_not_an_array_of_objects", "sft", text('[{"prompt": "a", "response": "b"}, 3]', ".json"),
     "item 2: expected a JSON object"),
    ("eos_literal_in_response", "sft",
     rows([SFT[0], {**SFT[1], "response": "dogs <|endoftext|> are good"}]),
     "1 rows contain the tokenizer's EOS token '<|endoftext|>' literally in response: rows 2"),
    ("pad_literal_in_prompt", "preference", rows([{**PREF[0], "prompt": "hi <|pad|> :"}, PREF[1]]),
     "PAD token '<|pad|>' literally in prompt: rows 1"),
    # well-formed files whose content fails an expectation (named, with example rows)
    ("chosen_equals_rejected", "preference",
     rows([{**PREF[0], "rejected": PREF[0]["chosen"]}, PREF[1]]),
     "1 pairs have chosen == rejected: rows 1 [expect_column_values_to_be_in_set]"),
    ("duplicate_pairs", "preference", rows([PREF[0], PREF[0], PREF[1]]),
     "2 rows repeat another row's prompt + chosen + rejected: rows 1, 2"),
    ("null_prompt", "preference", rows([{**PREF[0], "prompt": None}, PREF[1]]),
     "1 rows have no prompt (null or missing): rows 1 [expect_column_values_to_not_be_null]"),
    ("empty_chosen", "preference", rows([{**PREF[0], "chosen": ""}, PREF[1]]),
     "1 rows have an empty chosen: rows 1"),
    ("whitespace_only_response", "sft", rows([SFT[0], {**SFT[1], "response": "   "}]),
     "1 rows have a response of whitespace only: rows 2"),
    ("empty_csv_cell", "sft",
     frame(pd.DataFrame({"prompt": ["hello :", "tell me :"], "response": ["nice .", None]}),
           ".csv"), "1 rows have no response (null or missing): rows 3"),  # line 3
    ("long_chosen_dropped", "preference", rows([{**PREF[0], "chosen": LONG}, PREF[1]]),
     "0.500 of the preference rows were dropped as over the token budget (1 kept)"),
    ("every_pair_over_budget", "preference",
     rows([{**PREF[0], "chosen": LONG}, {**PREF[1], "rejected": LONG}]),
     "1.000 of the preference rows were dropped"),  # an empty frame still goes through the suites
    ("long_sft_response_dropped", "sft", rows([{**SFT[0], "response": LONG}, SFT[1]]),
     "0.500 of the sft rows were dropped"),
    ("long_prompt_without_paragraphs", "prompts", rows([{"prompt": LONG}, PROMPTS[1]]),
     "0.500 of the prompts rows were dropped"),
    ("prompts_mostly_truncated", "prompts",
     rows([{"prompt": "tell me :\n" + LONG}, {"prompt": "hello :\n" + LONG}]),
     "1.000 of the prompts rows had their prompt cut"),
]


def good_sources(tmp):
    return {"sft": DataSource(path=str(write_jsonl(tmp / "sft.jsonl", SFT))),
            "preference": DataSource(path=str(write_jsonl(tmp / "p.jsonl", PREF))),
            "prompts": DataSource(path=str(write_jsonl(tmp / "q.jsonl", PROMPTS)))}


def gate_message(tmp, sources: dict) -> str:
    """The data gate's verdict: a DataError's message, the failures, or 'PASSED'."""
    try:
        report = run_validation(DataConfig(**sources), make_tokenizer(), CFG, tmp / "out")
    except DataError as err:
        return f"DataError: {err}"
    return "PASSED" if report.passed else "\n".join(report.failures)


def test_the_corpus_has_at_least_25_distinct_cases():
    assert len(CASES) >= 25
    assert len({c[0] for c in CASES}) == len({c[3] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case, kind, write, needle", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_stopped_with_its_own_message(tmp_path, case, kind, write, needle):
    sources = good_sources(tmp_path)
    (tmp_path / "bad").mkdir()
    sources[kind] = write(tmp_path / "bad")
    message = gate_message(tmp_path, sources)
    assert needle in message, message
    assert str(tmp_path / "bad") in message  # names the file, whatever the failure
    assert not list((tmp_path / "out").glob("*.jsonl"))  # nothing handed on to training


def test_the_good_files_pass(tmp_path):
    assert gate_message(tmp_path, good_sources(tmp_path)) == "PASSED"


def test_expectation_failures_show_example_rows(tmp_path):
    sources = good_sources(tmp_path)
    sources["preference"] = DataSource(path=str(write_jsonl(
        tmp_path / "dup.jsonl", [PREF[1], {**PREF[0], "rejected": PREF[0]["chosen"]}])))
    message = gate_message(tmp_path, sources)
    assert 'row 2: {"prompt": "tell me about cats :"' in message, message


def test_every_failure_is_reported_not_just_the_first(tmp_path):
    sources = good_sources(tmp_path)
    bad = [{**PREF[0], "rejected": PREF[0]["chosen"]}, {**PREF[1], "chosen": ""}]
    sources["preference"] = DataSource(path=str(write_jsonl(tmp_path / "b.jsonl", bad)))
    message = gate_message(tmp_path, sources)
    assert "chosen == rejected" in message and "empty chosen" in message


def test_json_results_record_every_expectation(tmp_path):
    report = run_validation(DataConfig(**good_sources(tmp_path)), make_tokenizer(), CFG,
                            tmp_path / "out")
    types = {r["expectation_config"]["type"]
             for r in report.results_json["preference"]["results"]}
    assert {"expect_column_values_to_not_be_null", "expect_compound_columns_to_be_unique",
            "expect_column_values_to_not_match_regex"} <= types
    json.dumps(report.results_json)  # serialisable for the MLflow artifact


def test_a_numeric_margin_column_is_kept_for_the_reward_loss(tmp_path):
    sources = good_sources(tmp_path)
    pairs = [{**PREF[0], "margin": "0.5"}, {**PREF[1], "margin": 2}]
    sources["preference"] = DataSource(path=str(write_jsonl(tmp_path / "m.jsonl", pairs)))
    assert gate_message(tmp_path, sources) == "PASSED"
    cleaned = [json.loads(line) for line in (tmp_path / "out" / "preference.jsonl").open()]
    assert [r["margin"] for r in cleaned] == [0.5, 2.0]
    assert "margin" not in (tmp_path / "out" / "sft.jsonl").read_text()


def _named(tmp, name: str, content: bytes) -> DataSource:
    (tmp / name).write_bytes(content)
    return DataSource(path=str(tmp / name))


SFT_JSONL = "".join(json.dumps(r) + "\n" for r in SFT)


@pytest.mark.parametrize("name, content", [
    ("bom.jsonl", b"\xef\xbb\xbf" + SFT_JSONL.encode()),
    ("sep.jsonl", SFT_JSONL.replace("nice", "nice\u2028").replace("good", "good\u2029")
     .encode()),  # U+2028/9 written raw inside JSON strings: valid JSON, one row per line
    ("array.json", json.dumps(SFT).encode()),
    ("rows.jsonl.gz", gzip.compress(SFT_JSONL.encode())),
    ("rows.csv.bz2", bz2.compress(b"prompt,response\ntell me about cats :,cats are nice .\n"
                                  b"tell me about dogs :,dogs are good !\n")),
], ids=["utf8_bom", "u2028_in_strings", "json_array", "jsonl_gz", "csv_bz2"])
def test_valid_files_in_other_shapes_are_accepted(tmp_path, name, content):
    sources = good_sources(tmp_path)
    sources["sft"] = _named(tmp_path, name, content)
    assert gate_message(tmp_path, sources) == "PASSED"
    cleaned = [json.loads(line) for line in (tmp_path / "out" / "sft.jsonl").open()]
    assert len(cleaned) == 2 and cleaned[0]["prompt"] == "tell me about cats :"


def test_a_named_pipe_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "pipe.jsonl")
    sources = good_sources(tmp_path)
    sources["sft"] = DataSource(path=str(tmp_path / "pipe.jsonl"))
    assert "not a regular file" in gate_message(tmp_path, sources)


def test_a_local_looking_path_is_never_sent_to_a_hub(tmp_path, monkeypatch):
    import datasets

    def no_hub(*args, **kwargs):
        raise AssertionError(f"sent to the hub loader: {args}")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    monkeypatch.chdir(tmp_path)
    sources = good_sources(tmp_path)
    for path in ("pairs.jsonl.gz", "data/pairs.parquet", "./pairs"):
        sources["preference"] = DataSource(path=path)
        assert f"{Path(path)}: file not found" in gate_message(tmp_path, sources)


def test_control_characters_warn_by_default_and_refuse_when_asked(tmp_path):
    sources = good_sources(tmp_path)
    sources["sft"] = DataSource(path=str(write_jsonl(
        tmp_path / "nul.jsonl", [SFT[0], {**SFT[1], "response": "dogs\x00 are good"}])))
    report = run_validation(DataConfig(**sources), make_tokenizer(), CFG, tmp_path / "out")
    assert report.passed and any("control characters" in w and "rows 2" in w
                                 for w in report.warnings), report.warnings
    strict = CFG.model_copy(update={"control_characters": "refuse"})
    report = run_validation(DataConfig(**sources), make_tokenizer(), strict, tmp_path / "o2")
    assert not report.passed and "control characters" in report.failures[0]


def test_text_the_tokenizer_cannot_read_warns_with_the_share(tmp_path):
    sources = good_sources(tmp_path)
    sources["prompts"] = DataSource(path=str(write_jsonl(
        tmp_path / "greek.jsonl", [{"prompt": "καλημέρα κόσμε :"}, {"prompt": "γεια σου :"}])))
    report = run_validation(DataConfig(**sources), make_tokenizer(), CFG, tmp_path / "out")
    assert any("67% of the tokens are the tokenizer's unknown token" in w
               for w in report.warnings), report.warnings
    assert not any("unknown token" in w for w in gate_report_warnings(tmp_path))


def gate_report_warnings(tmp):
    return run_validation(DataConfig(**good_sources(tmp)), make_tokenizer(), CFG,
                          tmp / "o3").warnings
