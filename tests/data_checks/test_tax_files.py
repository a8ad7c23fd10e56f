"""The alignment tax's probe and text through the gate: read in every format the gate reads,
and a bad file refused naming the file and the row."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from data_checks.errors import DataError
from data_checks.tax_files import MAX_TEXT_CHARS, read_probe, read_text
from rlhf_core.eval.tax import PROBE_FILE, TEXT_FILE


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_shipped_probe_and_text_pass():
    assert len(read_probe(PROBE_FILE)) >= 150
    assert len(read_text(TEXT_FILE)) >= 10


def test_a_probe_reads_from_jsonl_csv_and_parquet(tmp_path):
    rows = [{"question": "What is 2 plus 3?", "answers": ["5", "five"]},
            {"question": "Capital of Peru?", "answers": ["Lima"]}]
    want = [("What is 2 plus 3?", ["5", "five"], ""), ("Capital of Peru?", ["Lima"], "")]
    assert read_probe(_jsonl(tmp_path / "p.jsonl", rows)) == want
    frame = pd.DataFrame({"question": [r["question"] for r in rows],
                          "answers": ["5|five", "Lima"]})
    frame.to_csv(tmp_path / "p.csv", index=False)
    assert read_probe(tmp_path / "p.csv") == want
    pd.DataFrame(rows).to_parquet(tmp_path / "p.parquet")
    assert read_probe(tmp_path / "p.parquet") == want


@pytest.mark.parametrize("rows, message", [
    ([{"question": "Q?", "answers": ["a"]}, {"question": " ", "answers": ["a"]}],
     r"p\.jsonl row 2: empty question"),
    ([{"question": "Q?", "answers": ["a"]}, {"question": "R?", "answers": []}],
     r"p\.jsonl row 2: no accepted answer"),
    ([{"question": "Q?", "answers": ["a"]}, {"question": "Q?", "answers": ["b"]}],
     r"p\.jsonl row 2: the question of row 1 again"),
    ([{"question": "Q?", "answers": [1, 2]}], r"p\.jsonl row 1: 'answers' must be a list"),
    ([{"question": "Q?", "answer": "a"}], r"p\.jsonl: no answers column"),
])
def test_a_bad_probe_is_refused_naming_file_and_row(tmp_path, rows, message):
    with pytest.raises(DataError, match=message):
        read_probe(_jsonl(tmp_path / "p.jsonl", rows))


def test_a_probe_in_an_unknown_format_or_missing_is_refused(tmp_path):
    (tmp_path / "p.docx").write_text("x")
    with pytest.raises(DataError, match="unknown format"):
        read_probe(tmp_path / "p.docx")
    with pytest.raises(DataError, match="no such file"):
        read_probe(tmp_path / "missing.jsonl")


def test_a_text_file_reads_as_paragraphs_and_a_table_as_its_text_column(tmp_path):
    (tmp_path / "t.txt").write_text("One line.\nStill one.\n\n\nTwo.\n", encoding="utf-8")
    assert read_text(tmp_path / "t.txt") == ["One line.\nStill one.", "Two."]
    assert read_text(_jsonl(tmp_path / "t.jsonl", [{"text": "a b"}, {"text": "c"}])) == \
        ["a b", "c"]


def test_a_bad_text_is_refused_naming_file_and_row(tmp_path):
    (tmp_path / "empty.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(DataError, match="empty.txt: file is empty"):
        read_text(tmp_path / "empty.txt")
    (tmp_path / "nul.txt").write_text("fine.\n\nbad\x00row\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"nul\.txt line 3: binary data"):
        read_text(tmp_path / "nul.txt")
    (tmp_path / "latin.txt").write_bytes(b"ok\n\ncaf\xe9\n")
    with pytest.raises(DataError, match=r"latin\.txt line 3: not valid UTF-8"):
        read_text(tmp_path / "latin.txt")
    (tmp_path / "long.txt").write_text("ok\n\n" + "x" * (MAX_TEXT_CHARS + 1), encoding="utf-8")
    with pytest.raises(DataError, match=r"long\.txt line 3: .* characters in one row"):
        read_text(tmp_path / "long.txt")
    with pytest.raises(DataError, match=r"t\.jsonl row 2: empty text"):
        read_text(_jsonl(tmp_path / "t.jsonl", [{"text": "a"}, {"text": ""}]))
    with pytest.raises(DataError, match="no text column"):
        read_text(_jsonl(tmp_path / "u.jsonl", [{"body": "a"}]))


def test_a_bad_pretraining_text_is_named_by_its_own_setting(tmp_path):
    (tmp_path / "mix.txt").write_text("\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"^data\.pretrain .*mix\.txt: file is empty"):
        read_text(tmp_path / "mix.txt", "data.pretrain")
    with pytest.raises(DataError, match=r"^data\.pretrain .*gone\.txt: no such file"):
        read_text(tmp_path / "gone.txt", "data.pretrain")
    with pytest.raises(DataError, match=r"^data\.pretrain .*u\.jsonl: no text column"):
        read_text(_jsonl(tmp_path / "u.jsonl", [{"body": "a"}]), "data.pretrain")
