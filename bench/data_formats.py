"""bench/data_scale.py's data in each format the gate reads (issue 47): the same rows, written
as plain JSONL (data_scale.py's own), TRL conversations, CSV, gzipped JSONL or gzipped
Parquet, one set at a time so that memory stays flat at any size.

- ``conversational``: SFT rows as ``messages`` (user, assistant); preference pairs as
  ``chosen``/``rejected`` whole conversations sharing the user message (implicit prompt);
  prompts as ``prompt`` messages; the config gets a one-line chat template (``CHAT_TEMPLATE``)
  whose end-of-turn token is the tokenizer's ``<|endoftext|>``.
- ``csv``: the same columns; a prompt with a paragraph break is a quoted field over two lines.
- ``jsonl.gz``: the JSONL, gzipped. ``parquet.gz``: a Parquet file (pyarrow's default snappy
  pages, row groups of 25,000 rows), gzipped whole.
"""

from __future__ import annotations

import csv
import gzip
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

FORMATS = ("plain", "conversational", "csv", "jsonl.gz", "parquet.gz")
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|endoftext|>"
                 "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
SUFFIX = {"conversational": ".jsonl", "csv": ".csv", "jsonl.gz": ".jsonl.gz",
          "parquet.gz": ".parquet.gz"}
ROWS = 25_000


def _rows(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            yield json.loads(line)


def _conversation(row: dict) -> dict:
    user = {"role": "user", "content": row["prompt"]}
    if "chosen" in row:
        return {"chosen": [user, {"role": "assistant", "content": row["chosen"]}],
                "rejected": [user, {"role": "assistant", "content": row["rejected"]}]}
    if "response" in row:
        return {"messages": [user, {"role": "assistant", "content": row["response"]}]}
    return {"prompt": [user]}


def _write_jsonl(rows: Iterator[dict], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def _write_csv(source: Path, path: Path) -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = None
        for row in _rows(source):
            if writer is None:
                writer = csv.DictWriter(fh, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)


def _write_parquet(source: Path, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer, batch = None, []

    def flush():
        nonlocal writer
        table = pa.Table.from_pylist(batch)
        if writer is None:
            writer = pq.ParquetWriter(str(path), table.schema)
        writer.write_table(table)

    for row in _rows(source):
        batch.append(row)
        if len(batch) >= ROWS:
            flush()
            batch = []
    if batch:
        flush()
    writer.close()


def _gzip(path: Path) -> Path:
    out = path.with_name(path.name + ".gz")
    with open(path, "rb") as src, gzip.open(out, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    path.unlink()
    return out


def write_format(plain: dict[str, Path], fmt: str, folder: Path) -> dict[str, Path]:
    """data_scale.py's JSONL sets ``plain`` -> the same rows in ``fmt`` under ``folder``
    (reused when there)."""
    if fmt == "plain":
        return plain
    folder.mkdir(parents=True, exist_ok=True)
    out = {name: folder / f"{name}{SUFFIX[fmt]}" for name in plain}
    for name, source in plain.items():
        if out[name].exists():
            continue
        tmp = folder / f".{name}"
        if fmt == "conversational":
            _write_jsonl((_conversation(r) for r in _rows(source)), tmp.with_suffix(".jsonl"))
            tmp.with_suffix(".jsonl").replace(out[name])
        elif fmt == "csv":
            _write_csv(source, tmp.with_suffix(".csv"))
            tmp.with_suffix(".csv").replace(out[name])
        elif fmt == "jsonl.gz":
            shutil.copyfile(source, tmp.with_suffix(".jsonl"))
            _gzip(tmp.with_suffix(".jsonl")).replace(out[name])
        else:
            _write_parquet(source, tmp.with_suffix(".parquet"))
            _gzip(tmp.with_suffix(".parquet")).replace(out[name])
    return out
