"""The gate in chunks (data_checks/validate.py, loading.py): a bad row at every place in a
chunk (first, last, either side of a boundary) is named by its row or line; repeats are found
across chunks; and chunked and one-chunk validation say and write the same."""

import json
import re

import pytest

import data_checks.loading as loading
import data_checks.validate as validate
from data_checks.config import DataConfig, DataSource, ValidationConfig
from data_checks.loading import DataError
from data_checks.tokens import read_tokens, tokens_path
from data_checks.validate import run_validation
from tests.conftest import make_tokenizer
from tests.shared import PROMPTS, write_jsonl

CFG = ValidationConfig(max_prompt_tokens=8, max_response_tokens=8, max_dropped_fraction=1.0)
WORDS = "cats dogs rain sun tea the weather nice good".split()


def _pairs(n):
    return [{"prompt": f"tell me about {WORDS[i % 9]} {WORDS[(i // 9) % 9]} :",
             "chosen": f"{WORDS[i % 9]} is nice .", "rejected": "bad"} for i in range(n)]


def _sft(n):
    return [{"prompt": f"tell me about {WORDS[i % 9]} {WORDS[(i // 9) % 9]} :",
             "response": f"{WORDS[i % 9]} is good ."} for i in range(n)]


def _gate(tmp, pref, sft=None, chunk=4, monkeypatch=None, cfg=CFG):
    tmp.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(validate, "CHUNK_ROWS", chunk)
    data = DataConfig(sft=DataSource(path=str(write_jsonl(tmp / "sft.jsonl", sft or _sft(6)))),
                      preference=DataSource(path=str(write_jsonl(tmp / "p.jsonl", pref))),
                      prompts=DataSource(path=str(write_jsonl(tmp / "q.jsonl", PROMPTS))))
    return run_validation(data, make_tokenizer(), cfg, tmp / "out")


# chunks of 4 rows over 10: rows 1 (first), 4 (last), 5 (after a boundary), 8, 9, 10 (last)
POSITIONS = [0, 3, 4, 7, 8, 9]


@pytest.mark.parametrize("position", POSITIONS)
def test_a_bad_row_at_every_chunk_position_is_named_by_its_row(tmp_path, monkeypatch,
                                                               position):
    pref = _pairs(10)
    pref[position]["rejected"] = pref[position]["chosen"]
    report = _gate(tmp_path, pref, monkeypatch=monkeypatch)
    same = [f for f in report.failures if "chosen == rejected" in f]
    assert len(same) == 1 and f"1 pairs have chosen == rejected: rows {position + 1} [" \
        in same[0], report.failures
    assert f"e.g. row {position + 1}: " in same[0]
    assert not (tmp_path / "out" / "preference.jsonl").exists()  # a failed gate writes none
    assert not list((tmp_path / "out").glob("*.part"))


@pytest.mark.parametrize("position", POSITIONS)
def test_a_malformed_line_at_every_chunk_position_is_named_by_its_line(tmp_path, monkeypatch,
                                                                      position):
    monkeypatch.setattr(loading, "KEEP_BYTES", 0)  # the gate streams it (not read ahead)
    lines = [json.dumps(r) for r in _pairs(10)]
    lines[position] = lines[position][:-2]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    source = DataSource(path=str(tmp_path / "p.jsonl"))
    with pytest.raises(DataError, match=rf"p.jsonl line {position + 1}: invalid JSON"):
        list(loading.iter_table(source, "preference", 4))
    lines[position] = json.dumps({**_pairs(10)[position], "chosen": 7})
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"p.jsonl row {position + 1}: field 'chosen' must"):
        list(loading.iter_table(source, "preference", 4))


def test_chunks_concatenate_to_the_whole_read(tmp_path):
    pref = _pairs(10)
    del pref[6]["rejected"]  # a key missing from one row only
    lines = [json.dumps(r) for r in pref]
    (tmp_path / "p.jsonl").write_text("\ufeff" + "\n\n".join(lines) + "\n")  # BOM, blank lines
    source = DataSource(path=str(tmp_path / "p.jsonl"))
    import pandas as pd

    whole = loading.load_table(source, "preference")
    for rows in (1, 3, 4, 100):
        chunks = list(loading.iter_table(source, "preference", rows))
        assert [len(c) for c in chunks[:-1]] == [rows] * (len(chunks) - 1)
        pd.testing.assert_frame_equal(pd.concat(chunks, ignore_index=True), whole,
                                      check_dtype=False)  # a chunk of nulls: object
    limited = DataSource(path=str(tmp_path / "p.jsonl"), limit=5)
    assert len(pd.concat(loading.iter_table(limited, "preference", 2))) == 5


def test_parquet_files_and_saved_datasets_are_read_in_chunks_too(tmp_path, monkeypatch):
    """Real preference sets often come as Parquet or hub datasets: they stream like JSONL
    (never read whole), concatenate to the whole read, and a bad row is named by its row."""
    import pandas as pd
    from datasets import Dataset

    pref = _pairs(10)
    pd.DataFrame(pref).to_parquet(tmp_path / "p.parquet", row_group_size=3)
    Dataset.from_list(pref).save_to_disk(str(tmp_path / "ds"))
    sources = [DataSource(path=str(tmp_path / "p.parquet")),
               DataSource(path=str(tmp_path / "ds"), format="hf")]
    wholes = [loading.load_table(s, "preference") for s in sources]
    monkeypatch.setattr(loading, "load_table", None)  # a whole read would fail
    for source, whole in zip(sources, wholes):
        for rows in (1, 4, 100):
            chunks = list(loading.iter_table(source, "preference", rows))
            assert [len(c) for c in chunks] == [min(rows, 10 - i) for i in range(0, 10, rows)]
            pd.testing.assert_frame_equal(pd.concat(chunks, ignore_index=True), whole)
    monkeypatch.undo()
    margins = [1.0] * 8 + [float("inf"), 1.0]  # row 9's margin is not finite
    pd.DataFrame(pref).assign(margin=margins).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad.parquet: column 'margin' must hold finite "
                       r"numbers; 1 rows do not: rows 9 "):
        list(loading.iter_table(DataSource(path=str(tmp_path / "bad.parquet")), "preference",
                                4))
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not parquet")
    with pytest.raises(DataError, match="broken.parquet: cannot read as parquet"):
        list(loading.iter_table(DataSource(path=str(tmp_path / "broken.parquet")),
                                "preference", 4))


def test_repeats_are_found_across_chunks(tmp_path, monkeypatch):
    pref = _pairs(10)
    pref[8] = dict(pref[1])  # rows 2 and 9: different chunks
    sft = _sft(9)
    sft[7] = dict(sft[0])
    report = _gate(tmp_path, pref, sft=sft, monkeypatch=monkeypatch)
    repeated = [f for f in report.failures if "repeat another row's" in f]
    assert len(repeated) == 1 and "2 rows repeat another row's prompt + chosen + rejected: " \
        "rows 2, 9 [" in repeated[0], report.failures
    assert report.results_json["preference"]["success"] is False
    assert any(w.startswith("sft (") and "1 rows repeat another row's prompt + response: rows 8 "
               in w for w in report.warnings), report.warnings
    # GX's Data Docs: one validation page per set (not per chunk), of the merged result
    from data_checks.validate import write_data_docs

    docs = write_data_docs(report, tmp_path / "docs")
    pages = sorted((docs / "gx" / "validations").rglob("*.html"))
    assert [p.name for p in pages] == ["rlhf-preference.html", "rlhf-prompts.html",
                                       "rlhf-sft.html"], pages
    page = " ".join(re.sub(r"<[^>]+>", " ", pages[0].read_text()).split())
    assert "Status: Failed" in page and "Unsuccessful Expectations 1" in page
    # the repeats across chunks, of the whole set's rows (not one chunk's 4 or 2)
    assert "2 unexpected values found. 20% of 10 total rows." in page, page[:3000]


@pytest.mark.parametrize("chunk", [1, 3, 4])
def test_chunked_and_whole_validation_agree(tmp_path, monkeypatch, chunk):
    """Reports, cleaned files and token files, a passing and a failing set alike."""
    pref = _pairs(11)
    pref[2]["chosen"] = "cats are nice . " * 4  # over budget: dropped
    pref[5]["prompt"] = "tell me\n" + "cats " * 10  # over budget: cut at the paragraph
    pref[9]["chosen"] = "cats <|endoftext|> ."  # a special token written out: fails
    pref[10]["rejected"] = "the dogs \x07 ."  # a control character: a warning
    for fail in (False, True):
        rows = pref if fail else pref[:9]
        one = _gate(tmp_path / f"one{fail}", rows, chunk=1000, monkeypatch=monkeypatch)
        many = _gate(tmp_path / f"many{fail}{chunk}", rows, chunk=chunk,
                     monkeypatch=monkeypatch)
        assert one.passed is not fail
        assert [f.replace(f"many{fail}{chunk}", f"one{fail}") for f in many.failures] == \
            one.failures
        assert [w.replace(f"many{fail}{chunk}", f"one{fail}") for w in many.warnings] == \
            one.warnings
        assert many.stats == one.stats
        assert many.dropped == one.dropped and [r["row"] for r in one.dropped["preference"]] \
            == [3] and one.dropped["preference"][0]["chosen"] == pref[2]["chosen"]
        assert many.expectation_counts() == one.expectation_counts()
        for name in ("sft", "preference", "prompts"):
            a = tmp_path / f"one{fail}" / "out" / f"{name}.jsonl"
            b = tmp_path / f"many{fail}{chunk}" / "out" / f"{name}.jsonl"
            assert a.exists() is b.exists() is (not fail)
            if not fail:
                assert a.read_bytes() == b.read_bytes()
                assert read_tokens(tokens_path(a)).equals(read_tokens(tokens_path(b)))


KILLED = """
import sys, time
from pathlib import Path
import data_checks.validate as validate
from data_checks.config import DataConfig, DataSource
from tests.conftest import make_tokenizer
from tests.data_checks.test_stream import CFG

where, stop_after = Path(sys.argv[1]), int(sys.argv[2])
validate.CHUNK_ROWS = 4
real, seen = validate.tokenize_frame, []


def slow(df, tokenizer):  # after stop_after chunks: say so, then wait to be killed
    if len(seen) == stop_after:
        (where / "in_the_gate").write_text("")
        time.sleep(600)
    seen.append(len(df))
    return real(df, tokenizer)


validate.tokenize_frame = slow
data = DataConfig(**{n: DataSource(path=str(where / f"{n}.jsonl"))
                     for n in ("sft", "preference", "prompts")})
validate.run_validation(data, make_tokenizer(), CFG, where / "out")
"""


def _counting(monkeypatch) -> list[int]:
    """Chunks of 4 rows, and the row count of every chunk tokenized from now on."""
    monkeypatch.setattr(validate, "CHUNK_ROWS", 4)
    real, calls = validate.tokenize_frame, []

    def counted(df, tokenizer):
        calls.append(len(df))
        return real(df, tokenizer)

    monkeypatch.setattr(validate, "tokenize_frame", counted)
    return calls


@pytest.mark.parametrize("stop_after", [1, 4])  # in the SFT set, in the preference set
def test_a_gate_killed_between_chunks_resumes_without_tokenizing_its_chunks_again(
        tmp_path, monkeypatch, stop_after):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    write_jsonl(tmp_path / "sft.jsonl", _sft(10))  # 3 chunks of 4 rows
    write_jsonl(tmp_path / "preference.jsonl", _pairs(10))
    write_jsonl(tmp_path / "prompts.jsonl", PROMPTS * 3)
    root = Path(__file__).resolve().parents[2]
    gate = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path), str(stop_after)],
                            cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "in_the_gate").exists():
            assert gate.poll() is None and time.monotonic() < deadline, "gate ended early"
            time.sleep(0.1)
        os.kill(gate.pid, signal.SIGKILL)
    finally:
        gate.wait()
    out = tmp_path / "out"
    assert not [p.name for p in out.iterdir() if not p.name.endswith(".part")
                and p.name != validate.CHUNKS]  # no half file
    assert len(list((out / validate.CHUNKS).glob("*.arrow"))) == stop_after
    data = DataConfig(**{n: DataSource(path=str(tmp_path / f"{n}.jsonl"))
                         for n in ("sft", "preference", "prompts")})
    calls = _counting(monkeypatch)
    report = run_validation(data, make_tokenizer(), CFG, out)
    assert report.passed, report.failures
    resumed, calls[:] = list(calls), []
    assert sorted(p.name for p in out.iterdir()) == sorted(  # the kept chunks are gone
        f"{n}{s}" for n in ("sft", "preference", "prompts") for s in (".jsonl", ".tokens.arrow"))
    whole = run_validation(data, make_tokenizer(), CFG, tmp_path / "whole")
    assert len(calls) > len(resumed) == len(calls) - stop_after  # only the unfinished chunks
    assert resumed == calls[stop_after:]
    assert whole.stats == report.stats
    for p in out.iterdir():
        assert p.read_bytes() == (tmp_path / "whole" / p.name).read_bytes()


def test_a_gate_stopped_by_a_malformed_line_tokenizes_only_the_changed_chunk_again(
        tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "KEEP_BYTES", 0)  # read as it streams, not ahead
    write_jsonl(tmp_path / "sft.jsonl", _sft(10))
    write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    lines = [json.dumps(r) for r in _pairs(10)]
    good, lines[6] = lines[6], lines[6][:-2]  # row 7: the second chunk of the pairs
    (tmp_path / "preference.jsonl").write_text("\n".join(lines) + "\n")
    data = DataConfig(**{n: DataSource(path=str(tmp_path / f"{n}.jsonl"))
                         for n in ("sft", "preference", "prompts")})
    calls = _counting(monkeypatch)
    with pytest.raises(DataError, match="preference.jsonl line 7: invalid JSON"):
        run_validation(data, make_tokenizer(), CFG, tmp_path / "out")
    assert calls == [4, 4, 2, 4]  # the SFT set, then the pairs' first chunk
    lines[6] = good
    (tmp_path / "preference.jsonl").write_text("\n".join(lines) + "\n")
    calls[:] = []
    report = run_validation(data, make_tokenizer(), CFG, tmp_path / "out")
    assert report.passed, report.failures
    assert calls == [4, 2, len(PROMPTS)]  # from the fixed chunk on
    assert not (tmp_path / "out" / validate.CHUNKS).exists()  # a verdict: none kept


def test_with_the_cache_a_file_with_rows_appended_tokenizes_only_its_new_chunks(
        tmp_path, monkeypatch):
    """A retrain round's preference file is the last round's with the new batch appended:
    every full chunk of the last round's file is read from the cache, and so are the
    unchanged sets; the result is what a gate without the cache writes."""
    from data_checks.cache import ValidationCache

    cache = ValidationCache(tmp_path / "cache")
    write_jsonl(tmp_path / "sft.jsonl", _sft(10))
    write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    data = DataConfig(**{n: DataSource(path=str(tmp_path / f"{n}.jsonl"))
                         for n in ("sft", "preference", "prompts")})
    calls = _counting(monkeypatch)
    write_jsonl(tmp_path / "preference.jsonl", _pairs(10))  # chunks of 4, 4, 2
    assert run_validation(data, make_tokenizer(), CFG, tmp_path / "one", cache=cache).passed
    assert calls == [4, 4, 2, 4, 4, 2, len(PROMPTS)]
    calls[:] = []
    write_jsonl(tmp_path / "preference.jsonl", _pairs(15))  # 5 pairs appended: 4, 4, 4, 3
    report = run_validation(data, make_tokenizer(), CFG, tmp_path / "two", cache=cache)
    assert report.passed and not report.reused, report.failures
    assert calls == [4, 3]  # rows 9-15 of the pairs; the rest came from the cache
    assert not (tmp_path / "two" / validate.CHUNKS).exists()  # the cache's chunks, not a gate's
    whole = run_validation(data, make_tokenizer(), CFG, tmp_path / "whole")
    assert whole.stats == report.stats
    for p in (tmp_path / "whole").iterdir():
        assert p.read_bytes() == (tmp_path / "two" / p.name).read_bytes(), p.name


def test_a_set_whose_every_row_is_dropped_writes_what_one_write_of_it_would(tmp_path,
                                                                            monkeypatch):
    import pandas as pd

    from data_checks.validate import write_cleaned

    pref = _pairs(5)
    for row in pref:
        row["chosen"] = "cats are nice . " * 4  # over budget: every pair dropped
    report = _gate(tmp_path, pref, chunk=2, monkeypatch=monkeypatch)
    assert report.passed and report.stats["preference/n_rows"] == 0.0, report.failures
    cleaned = tmp_path / "out" / "preference.jsonl"
    write_cleaned(pd.DataFrame(columns=["prompt", "chosen", "rejected"]), tmp_path / "one")
    assert cleaned.read_bytes() == (tmp_path / "one").read_bytes()
    table = read_tokens(tokens_path(cleaned))
    assert table.num_rows == 0 and table.column_names == ["prompt_ids", "chosen_ids",
                                                          "rejected_ids"]
