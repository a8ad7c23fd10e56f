"""Every format the gate reads streams (issue 47): JSONL, gzipped JSONL, CSV, Parquet (a
compressed codec, or gzipped whole) and TRL conversations are read, rendered, tokenized and
checked chunk by chunk, never whole, and a bad row at every place in a chunk is named by its
line in the file (its row in a Parquet file)."""

import csv
import gzip
import io
import json

import pandas as pd
import pytest

import data_checks.files as files
import data_checks.loading as loading
import data_checks.validate as validate
from data_checks.config import DataConfig, DataSource, ValidationConfig
from data_checks.loading import DataError
from data_checks.validate import ensure_special_tokens, run_validation
from rlhf_core.models import chat
from tests.conftest import make_tokenizer
from tests.families import FAMILIES, build_tokenizer
from tests.shared import PROMPTS, SFT, write_jsonl

CFG = ValidationConfig(max_prompt_tokens=8, max_response_tokens=8, max_dropped_fraction=1.0)
W = "cats dogs rain sun hello world nice good sure".split()
POSITIONS = [0, 3, 4, 7, 8, 9]  # chunks of 4 over 10 rows: first, last, either side, end


def _pairs(n=10):
    return [{"prompt": f"tell me about {W[i % 9]} {W[(i // 9) % 9]} :",
             "chosen": f"{W[i % 9]} is nice .", "rejected": "bad"} for i in range(n)]


def _jsonl_text(rows):
    """Rows as JSONL with a blank line after the second -> (text, each row's line)."""
    text, lines = "", []
    for i, row in enumerate(rows):
        text += json.dumps(row) + "\n"
        lines.append(len(text.split("\n")) - 1)
        text += "\n" if i == 1 else ""
    return text, lines


def write(tmp, fmt, rows):
    """``rows`` as a file of ``fmt`` -> (its path, each row's line or row in it)."""
    if fmt in ("jsonl", "jsonl.gz"):
        text, lines = _jsonl_text(rows)
        data = text.encode() if fmt == "jsonl" else gzip.compress(text.encode())
    elif fmt == "csv":  # the first row's prompt is a quoted field over two lines
        buf = io.StringIO(newline="")
        out = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        out.writeheader()
        lines, line = [], 2
        for i, row in enumerate(rows):
            row = {**row, "prompt": "hello\n" + row["prompt"]} if i == 0 else row
            out.writerow(row)
            lines.append(line)
            line += 1 + sum(str(v).count("\n") for v in row.values())
        data = buf.getvalue().encode()
    else:
        buf = io.BytesIO()
        pd.DataFrame(rows).to_parquet(buf, compression="zstd", row_group_size=3)
        data = buf.getvalue() if fmt == "parquet" else gzip.compress(buf.getvalue())
        lines = list(range(1, len(rows) + 1))
    path = tmp / f"pairs.{fmt}"
    path.write_bytes(data)
    return path, lines


FORMATS = ["jsonl", "jsonl.gz", "csv", "parquet", "parquet.gz"]


def _no_whole_reads(monkeypatch):
    monkeypatch.setattr(loading, "_numbered_table", None)  # a whole read would fail
    monkeypatch.setattr(loading, "read_local", None)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_is_read_in_chunks_equal_to_the_whole_read(tmp_path, monkeypatch, fmt):
    path, lines = write(tmp_path, fmt, _pairs())
    source = DataSource(path=str(path))
    whole = loading.load_table(source, "preference")
    _no_whole_reads(monkeypatch)
    chunks = list(loading.iter_table(source, "preference", 4))
    assert [len(c) for c in chunks] == [4, 4, 2]
    assert [i + 1 for c in chunks for i in c.index] == lines  # each row's place in the file
    pd.testing.assert_frame_equal(pd.concat(chunks, ignore_index=True), whole)
    assert whole.loc[0, "prompt"].endswith(_pairs()[0]["prompt"])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("position", POSITIONS)
def test_a_bad_row_at_every_chunk_position_is_named_by_its_line(tmp_path, monkeypatch, fmt,
                                                                position):
    monkeypatch.setattr(validate, "CHUNK_ROWS", 4)
    rows = _pairs()
    rows[position]["rejected"] = rows[position]["chosen"]
    path, lines = write(tmp_path, fmt, rows)
    data = DataConfig(sft=DataSource(path=str(write_jsonl(tmp_path / "s.jsonl", SFT))),
                      preference=DataSource(path=str(path)),
                      prompts=DataSource(path=str(write_jsonl(tmp_path / "q.jsonl", PROMPTS))))
    _no_whole_reads(monkeypatch)
    report = run_validation(data, make_tokenizer(), CFG, tmp_path / "out")
    (same,) = [f for f in report.failures if "chosen == rejected" in f]
    assert f"1 pairs have chosen == rejected: rows {lines[position]} [" in same, same
    assert f"e.g. row {lines[position]}: " in same


@pytest.mark.parametrize("position", POSITIONS)
def test_a_malformed_row_at_every_chunk_position_is_named_by_its_line(tmp_path, position):
    rows = _pairs()
    text, lines = _jsonl_text(rows)
    broken = text.split("\n")
    broken[lines[position] - 1] = broken[lines[position] - 1][:-2]
    (tmp_path / "p.jsonl.gz").write_bytes(gzip.compress("\n".join(broken).encode()))
    with pytest.raises(DataError, match=rf"p.jsonl.gz line {lines[position]}: invalid JSON"):
        list(loading.iter_table(DataSource(path=str(tmp_path / "p.jsonl.gz")), "preference", 4))
    path, lines = write(tmp_path, "csv", rows)
    text = path.read_text().split("\n")
    text[lines[position] - (0 if position == 0 else 1)] += ",one too many"  # the row's end
    path.write_text("\n".join(text))
    with pytest.raises(DataError, match=rf"pairs.csv line {lines[position]}: cannot read as "
                       r"csv \(expected 3 fields, saw 4\)"):
        list(loading.iter_table(DataSource(path=str(path)), "preference", 4))


def test_csv_cells_read_as_pandas_reads_them(tmp_path):
    (tmp_path / "s.csv").write_text('prompt,response\r\nhello :,NA\r\n\r\n"a, ""b""\nc",\r\n'
                                    'sun :\r\n')
    table = loading.load_table(DataSource(path=str(tmp_path / "s.csv")), "sft")
    want = pd.read_csv(tmp_path / "s.csv", dtype=str)
    assert table["prompt"].tolist() == want["prompt"].tolist() == \
        ["hello :", 'a, "b"\nc', "sun :"]
    assert table["response"].isna().all() and want["response"].isna().all()
    assert next(files.iter_csv(tmp_path / "s.csv", None, 9)).index.tolist() == [1, 3, 5]


# conversations: TRL's formats, rendered with the template chunk by chunk

def _chat_tokenizer():
    tok = build_tokenizer(FAMILIES["qwen2"])
    ensure_special_tokens(tok)
    return tok


def _conversations(n=10):
    def user(text):
        return {"role": "user", "content": text}

    def bot(text):
        return {"role": "assistant", "content": text}

    sft = [{"messages": [user(f"hello {i}"), bot(f"sure {i}")]} for i in range(n)]
    pref = [{"chosen": [user(f"hi {i}"), bot("sure thanks")],
             "rejected": [user(f"hi {i}"), bot("bad")]} for i in range(n)]
    prompts = [{"prompt": [user(f"why rain {i}")]} for i in range(n)]
    return sft, pref, prompts


def _chat_data(tmp, sft, pref, prompts):
    paths = {}
    for name, rows in (("sft", sft), ("preference", pref), ("prompts", prompts)):
        text, lines = _jsonl_text(rows)
        (tmp / f"{name}.jsonl").write_text(text)
        paths[name] = (DataSource(path=str(tmp / f"{name}.jsonl")), lines)
    return DataConfig(**{n: s for n, (s, _) in paths.items()}), {n: v for n, (_, v) in
                                                                  paths.items()}


CHAT_CFG = ValidationConfig(max_prompt_tokens=64, max_response_tokens=16)


@pytest.mark.parametrize("position", POSITIONS)
def test_conversations_stream_and_a_bad_row_is_named_by_its_line(tmp_path, monkeypatch,
                                                                 position):
    monkeypatch.setattr(validate, "CHUNK_ROWS", 4)
    sft, pref, prompts = _conversations()
    pref[position]["rejected"] = pref[position]["chosen"]
    data, lines = _chat_data(tmp_path, sft, pref, prompts)
    _no_whole_reads(monkeypatch)
    report = run_validation(data, _chat_tokenizer(), CHAT_CFG, tmp_path / "out", chat=chat)
    (same,) = [f for f in report.failures if "chosen == rejected" in f]
    line = lines["preference"][position]
    assert f"1 pairs have chosen == rejected: rows {line} [" in same and \
        f"e.g. row {line}: " in same, same
    assert report.chat["end_of_turn"] == "<|im_end|>"
    sft[position]["messages"][0]["content"] = "hi <|im_end|>"  # ends the turn: refused
    data, lines = _chat_data(tmp_path, sft, _conversations()[1], prompts)
    with pytest.raises(DataError, match=rf"sft.jsonl row {lines['sft'][position]}: a message "
                       "holds the token '<|im_end|>' literally"):
        run_validation(data, _chat_tokenizer(), CHAT_CFG, tmp_path / "o2", chat=chat)
    sft[position]["messages"][0]["role"] = "robot"
    data, lines = _chat_data(tmp_path, sft, _conversations()[1], prompts)
    with pytest.raises(DataError, match=rf"sft.jsonl row {lines['sft'][position]} "
                       r"\(conversational\): field 'messages' message 1 must have a role"):
        run_validation(data, _chat_tokenizer(), CHAT_CFG, tmp_path / "o3", chat=chat)


def test_the_pre_read_of_a_large_conversational_file_reads_its_first_chunk_only(
        tmp_path, monkeypatch):
    data, _ = _chat_data(tmp_path, *_conversations(30))
    monkeypatch.setattr(loading, "KEEP_BYTES", 0)  # every file "large"
    monkeypatch.setattr(loading, "FIRST_ROWS", 4)
    seen = []
    real = loading._to_schema
    monkeypatch.setattr(loading, "_to_schema", lambda df, *a: seen.append(len(df)) or
                        real(df, *a))
    _no_whole_reads(monkeypatch)
    loading.read_every_source(data)
    assert seen == [4, 4, 4] and not loading._READ
