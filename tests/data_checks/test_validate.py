"""The data gate: good data passes; each bad input fails with its own message."""

import json
from pathlib import Path

import pandas as pd
import pytest

from data_checks.config import DataConfig, DataSource, ValidationConfig
from data_checks.loading import DataError, load_table
from data_checks.validate import (
    cut_at_paragraph,
    ensure_special_tokens,
    run_validation,
    write_cleaned,
    write_data_docs,
)
from tests.conftest import make_tokenizer
from tests.shared import PREF, PROMPTS, SFT, write_jsonl

CFG = ValidationConfig(max_prompt_tokens=8, max_response_tokens=8)

def data_config(tmp_path, sft=SFT, pref=PREF, prompts=PROMPTS):
    return DataConfig(sft=DataSource(path=str(write_jsonl(tmp_path / "sft.jsonl", sft))),
                      preference=DataSource(path=str(write_jsonl(tmp_path / "p.jsonl", pref))),
                      prompts=DataSource(path=str(write_jsonl(tmp_path / "q.jsonl", prompts))))


def test_good_data_passes_and_writes_clean_files(tmp_path, capfd):
    report = run_validation(data_config(tmp_path), make_tokenizer(), CFG, tmp_path / "out")
    assert report.passed, report.failures
    assert "Calculating Metrics" not in capfd.readouterr().err  # GX's tqdm bars are off
    assert (tmp_path / "out" / "preference.jsonl").exists()
    docs = write_data_docs(report, tmp_path / "docs")
    assert "PASSED" in (docs / "index.html").read_text()
    # great-expectations' own Data Docs: an index and one validation page per dataset
    gx_index = (docs / "gx" / "index.html").read_text()
    assert "rlhf_preference" in gx_index and "rlhf_sft" in gx_index
    assert len(list((docs / "gx" / "validations").rglob("*.html"))) == 3
    assert json.loads((docs / "results.json").read_text())["preference"]["success"]


@pytest.mark.parametrize("pref, needle", [
    ([{**PREF[0], "rejected": PREF[0]["chosen"]}, PREF[1]], "chosen == rejected"),
    ([PREF[0], PREF[0], PREF[1]], "expect_compound_columns_to_be_unique"),
    ([{**PREF[0], "prompt": None}, PREF[1]], "expect_column_values_to_not_be_null"),
    ([{**PREF[0], "chosen": ""}, PREF[1]], "expect_column_value_lengths_to_be_between"),
    ([{**PREF[0], "chosen": "cats " * 20}, PREF[1]], "rows were dropped"),
])
def test_bad_preference_rows_fail_with_a_named_expectation(tmp_path, pref, needle):
    report = run_validation(data_config(tmp_path, pref=pref), make_tokenizer(), CFG,
                            tmp_path / "out")
    assert not report.passed
    assert any(needle in f for f in report.failures), report.failures
    assert not (tmp_path / "out" / "preference.jsonl").exists()  # nothing for training


def test_gx_data_docs_of_a_failed_gate_show_the_failed_expectation(tmp_path):
    pref = [{**PREF[0], "rejected": PREF[0]["chosen"]}, PREF[1]]
    report = run_validation(data_config(tmp_path, pref=pref), make_tokenizer(), CFG,
                            tmp_path / "out")
    assert not list((tmp_path / "out").iterdir())  # no docs, no data until asked for docs
    docs = write_data_docs(report, tmp_path / "docs")
    index = (docs / "gx" / "index.html").read_text()
    assert index.count("'_validation_success_text': 'Failed'") == 1  # preference only
    (page,) = (docs / "gx" / "validations" / "rlhf_preference").rglob("*.html")
    assert "chosen_equals_rejected" in page.read_text()
    assert report.expectation_counts()["preference"] == (13, 14)
    assert "| preference | 13/14 | 2 |" in report.summary_markdown()


def test_failure_names_example_rows(tmp_path):
    pref = [{**PREF[0], "rejected": PREF[0]["chosen"]}, PREF[1]]
    report = run_validation(data_config(tmp_path, pref=pref), make_tokenizer(), CFG,
                            tmp_path / "out")
    assert any("row 1" in f and "preference" in f for f in report.failures)


@pytest.mark.parametrize("content, suffix, needle", [
    ('{"prompt": "a", "response": "b"}\n{"prompt": "a",\n', ".jsonl", "line 2: invalid JSON"),
    ("", ".jsonl", "file is empty"),
    ('{"prompt": "a"}\n', ".jsonl", "missing column 'response'"),
    ('{"prompt": 3, "response": "b"}\n', ".jsonl", "field 'prompt' must be a string"),
    (b"prompt,response\n\xff\xfe,x\n", ".csv", "not valid UTF-8"),
])
def test_malformed_files_name_file_and_place(tmp_path, content, suffix, needle):
    path = tmp_path / f"bad{suffix}"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DataError, match=needle) as err:
        load_table(DataSource(path=str(path)), "sft")
    assert str(path) in str(err.value)


@pytest.mark.parametrize("name", ["pairs.jsonl", "pairs.csv.gz"])
def test_a_folder_named_like_a_data_file_is_called_a_folder(tmp_path, name):
    (tmp_path / name).mkdir()
    with pytest.raises(DataError, match="a folder, not a") as err:
        load_table(DataSource(path=str(tmp_path / name)), "sft")
    assert str(tmp_path / name) in str(err.value) and "Errno" not in str(err.value)


def test_csv_parquet_and_column_map(tmp_path):
    df = pd.DataFrame({"question": ["a b", "c"], "answer": ["x", "y"]})
    df.to_csv(tmp_path / "d.csv", index=False)
    df.to_parquet(tmp_path / "d.parquet")
    for name in ("d.csv", "d.parquet"):
        src = DataSource(path=str(tmp_path / name),
                         column_map={"question": "prompt", "answer": "response"})
        assert load_table(src, "sft")["response"].tolist() == ["x", "y"]


def test_saved_hf_dataset_loads(tmp_path):
    from datasets import Dataset

    Dataset.from_list(SFT).save_to_disk(str(tmp_path / "ds"))
    df = load_table(DataSource(path=str(tmp_path / "ds"), format="hf"), "sft")
    assert df["prompt"].tolist() == [r["prompt"] for r in SFT]


def test_prompt_cut_at_last_paragraph_that_fits():
    tok = make_tokenizer()
    prompt = "tell me about cats\nthe sun is nice\nthe rain is bad and good"
    assert cut_at_paragraph(prompt, tok, 8) == "tell me about cats\nthe sun is nice"
    assert cut_at_paragraph("tell me about cats the sun is nice", tok, 3) is None


def test_missing_or_eos_pad_gets_a_dedicated_pad_token():
    tok = make_tokenizer(pad=False)
    record = ensure_special_tokens(tok)
    assert record["pad_added"] and tok.pad_token_id != tok.eos_token_id
    assert not ensure_special_tokens(make_tokenizer())["pad_added"]


def test_the_demo_data_passes_the_gate_with_the_demo_settings(tmp_path):
    import yaml

    from rlhf_core.demo import build_demo_tokenizer, generate_demo_data

    paths = generate_demo_data(tmp_path / "data", seed=0)  # the default (demo) sizes
    tok = build_demo_tokenizer([v for p in paths.values() for line in p.read_text().splitlines()
                                for v in json.loads(line).values()], tmp_path / "tok")
    demo = yaml.safe_load((Path(__file__).parents[2] / "configs" / "demo.yaml").read_text())
    data = DataConfig(**{name: DataSource(path=str(p)) for name, p in paths.items()})
    report = run_validation(data, tok, ValidationConfig(**demo["validation"]), tmp_path / "out")
    assert report.passed, report.failures
    assert report.stats["preference/n_rows"] == 2000 and report.stats["sft/n_dropped"] == 0


@pytest.mark.parametrize("n", [0, 1, 4, 5, 9])
def test_cleaned_files_are_written_in_chunks_as_pandas_writes_them_whole(tmp_path, n):
    df = pd.DataFrame({"prompt": [f"p {i}\né" if i % 3 else None for i in range(n)],
                       "margin": [i / 3 for i in range(n)]})
    df.to_json(tmp_path / "whole.jsonl", orient="records", lines=True, force_ascii=False)
    write_cleaned(df, tmp_path / "chunks.jsonl", rows=4)
    assert (tmp_path / "chunks.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
