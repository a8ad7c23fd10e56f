"""The gate names rows as the file has them (issue 47): after rows dropped for their length,
and with blank lines in the file, every finding (repeats across chunks included) names the
rows' lines; a failure shows example rows for each check it failed."""

import json
import re

import pytest

import data_checks.validate as validate
from data_checks.config import DataConfig, DataSource, ValidationConfig
from data_checks.validate import run_validation
from tests.conftest import make_tokenizer
from tests.shared import PROMPTS, SFT, write_jsonl

CFG = ValidationConfig(max_prompt_tokens=8, max_response_tokens=8, max_dropped_fraction=1.0)
WORDS = "cats dogs rain sun tea the weather nice good".split()
LONG = " ".join(["cats"] * 40)  # far over the 8-token budget: the row is dropped


def _pairs(n):
    return [{"prompt": f"tell me about {WORDS[i % 9]} {WORDS[(i // 9) % 9]} :",
             "chosen": f"{WORDS[i % 9]} is nice .", "rejected": "bad"} for i in range(n)]


def _write_lines(path, rows, blank_after=()):
    """JSONL with a blank line after each row position in ``blank_after`` -> each row's line."""
    text, lines, line = "", [], 0
    for i, row in enumerate(rows):
        line += 1
        text += json.dumps(row) + "\n"
        lines.append(line)
        if i in blank_after:
            line += 1
            text += "\n"
    path.write_text(text)
    return lines


def _gate(tmp, pref_path, sft_rows=SFT, cfg=CFG, out="out"):
    data = DataConfig(sft=DataSource(path=str(write_jsonl(tmp / "sft.jsonl", sft_rows))),
                      preference=DataSource(path=str(pref_path)),
                      prompts=DataSource(path=str(write_jsonl(tmp / "q.jsonl", PROMPTS))))
    return run_validation(data, make_tokenizer(), cfg, tmp / out)


@pytest.mark.parametrize("dropped", [0, 2, 5])
def test_repeats_across_chunks_are_named_by_line_after_dropped_rows(tmp_path, monkeypatch,
                                                                    dropped):
    monkeypatch.setattr(validate, "CHUNK_ROWS", 4)
    pref = _pairs(12)
    pref[dropped]["chosen"] = LONG  # dropped for its length before the pairs are compared
    pref[3] = dict(pref[9])  # row 4 (chunk 1) repeats row 10 (chunk 3)
    pref[7] = dict(pref[9])  # and row 8 (chunk 2)
    lines = _write_lines(tmp_path / "p.jsonl", pref, blank_after=(1,))  # rows != lines
    report = _gate(tmp_path, tmp_path / "p.jsonl")
    (repeat,) = [f for f in report.failures if "repeat another row's" in f]
    want = ", ".join(str(lines[i]) for i in (3, 7, 9))
    assert f"3 rows repeat another row's prompt + chosen + rejected: rows {want} [" in repeat
    shown = [int(n) for n in re.findall(r"row (\d+): \{", repeat)]
    assert shown and set(shown) <= {lines[i] for i in (3, 7, 9)}, repeat
    dropped_rows = [r["row"] for r in report.dropped["preference"]]
    assert dropped_rows == [lines[dropped]]


def test_every_finding_names_lines_in_a_file_with_blank_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "CHUNK_ROWS", 3)
    pref = _pairs(9)
    pref[0]["chosen"] = LONG  # dropped
    pref[4]["rejected"] = pref[4]["chosen"]  # GX: chosen == rejected
    pref[6]["chosen"] = "nice <|endoftext|> ."  # a text check: EOS literally
    pref[8]["prompt"] = "hi \x01 :"  # a warning: a control character
    lines = _write_lines(tmp_path / "p.jsonl", pref, blank_after=(0, 3, 5))
    report = _gate(tmp_path, tmp_path / "p.jsonl")
    text = "\n".join(report.failures + report.warnings)
    assert f"chosen == rejected: rows {lines[4]} [" in text, text
    assert f"e.g. row {lines[4]}: " in text
    assert f"literally in chosen: rows {lines[6]} (" in text
    assert f"control characters (NUL or other non-printing characters): rows {lines[8]}" in text


def test_repeated_sft_rows_and_prompts_are_warned_by_line(tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "CHUNK_ROWS", 2)
    sft_rows = [SFT[0], SFT[1], {"prompt": "x :", "response": LONG}, SFT[1], SFT[0]]
    lines = _write_lines(tmp_path / "s.jsonl", sft_rows, blank_after=(2,))
    data = DataConfig(sft=DataSource(path=str(tmp_path / "s.jsonl")),
                      preference=DataSource(path=str(write_jsonl(tmp_path / "p.jsonl",
                                                                 _pairs(2)))),
                      prompts=DataSource(path=str(write_jsonl(tmp_path / "q.jsonl", PROMPTS))))
    report = run_validation(data, make_tokenizer(), CFG, tmp_path / "out")
    (warning,) = [w for w in report.warnings if "repeat another row's" in w]
    assert f"2 rows repeat another row's prompt + response: rows {lines[3]}, {lines[4]} " \
        "(kept" in warning


def test_a_failure_shows_example_rows_for_each_check_it_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "CHUNK_ROWS", 3)
    pref = _pairs(8)
    pref[1]["chosen"] = LONG  # dropped: over validation.max_dropped_fraction below
    pref[2]["prompt"] = None  # GX: no prompt
    pref[3]["rejected"] = pref[3]["chosen"]  # GX: chosen == rejected
    pref[5]["rejected"] = "bad <|endoftext|>"  # text check: EOS literally
    pref[6]["prompt"] = "tell me\n" + " ".join(["about"] * 20)  # cut at its paragraph break
    pref[7] = dict(pref[0])  # repeats row 1, across chunks
    lines = _write_lines(tmp_path / "p.jsonl", pref, blank_after=(4,))
    cfg = CFG.model_copy(update={"max_dropped_fraction": 0.05, "max_truncated_fraction": 0.05})
    report = _gate(tmp_path, tmp_path / "p.jsonl", cfg=cfg)
    checks = {"dropped as over the token budget": 1, "had their prompt cut": 6,
              "have no prompt": 2, "chosen == rejected": 3, "literally in rejected": 5,
              "repeat another row's": 7}
    for words, i in checks.items():
        (failure,) = [f for f in report.failures if words in f]
        assert f"e.g. row {lines[i]}: " in failure, failure
    assert all("; e.g. row " in f for f in report.failures), report.failures


def test_at_most_the_configured_example_rows_are_shown(tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "CHUNK_ROWS", 4)
    pref = _pairs(12)
    for row in pref:
        row["rejected"] = row["chosen"]
    report = _gate(tmp_path, write_jsonl(tmp_path / "p.jsonl", pref))
    (same,) = [f for f in report.failures if "chosen == rejected" in f]
    assert same.count(": {") == CFG.example_rows == 5
    assert "e.g. row 1: " in same and "row 5: " in same and "row 6: " not in same
