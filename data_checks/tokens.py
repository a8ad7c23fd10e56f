"""Tokenize once: every text of a data set goes through the tokenizer one time, in batches, and
the gate's checks read the result. Per text column ``c`` it holds ``c_ids`` (without special
tokens, as the stages encode), ``c_len``, ``c_unk`` (unknown tokens) and, after the budget, the
flag ``c_cut``; each text is encoded alone, so the ids depend on neither batch nor threads.

The ids go to disk so the stages read them memory-mapped instead of tokenizing again:
``data/<name>.jsonl`` has ``data/<name>.tokens.arrow`` beside it, an Arrow IPC file with one
``<c>_ids`` column per text column, row for row.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

BATCH = 1024  # texts per tokenizer call: small enough that its encodings never pile up
TEXT_COLUMNS = ("prompt", "response", "chosen", "rejected")
SUFFIX = ".tokens.arrow"
IDS = pa.list_(pa.int32())


_THREADS = threading.Lock()
_THREADED = {"count": 0, "before": None}  # gates tokenizing now, TOKENIZERS_PARALLELISM before


@contextmanager
def tokenizer_threads() -> Iterator[None]:
    """Let a fast tokenizer use every core (the CLI turns its threads off, as processes fork)
    until the last gate tokenizing in this process is done."""
    with _THREADS:
        if _THREADED["count"] == 0:
            _THREADED["before"] = os.environ.get("TOKENIZERS_PARALLELISM")
            os.environ["TOKENIZERS_PARALLELISM"] = "true"
        _THREADED["count"] += 1
    try:
        yield
    finally:
        with _THREADS:
            _THREADED["count"] -= 1
            if _THREADED["count"] == 0:
                if _THREADED["before"] is None:
                    os.environ.pop("TOKENIZERS_PARALLELISM", None)
                else:
                    os.environ["TOKENIZERS_PARALLELISM"] = _THREADED["before"]


def _call(tokenizer, texts: list[str]) -> list[list[int]]:
    return tokenizer(texts, add_special_tokens=False, return_attention_mask=False,
                     return_token_type_ids=False)["input_ids"]


def _plain_backend(tokenizer):
    """The Rust tokenizer a plain fast tokenizer's call goes straight to, else None."""
    from transformers import PreTrainedTokenizerBase
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    kind = type(tokenizer)
    backend = getattr(tokenizer, "_tokenizer", None)
    if not isinstance(tokenizer, TokenizersBackend) or \
            not hasattr(backend, "encode_batch_fast") or \
            kind._encode_plus is not TokenizersBackend._encode_plus or \
            kind.__call__ is not PreTrainedTokenizerBase.__call__:
        return None
    return backend


def encode_batch(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """``tokenizer(text, add_special_tokens=False)["input_ids"]`` of each text; a plain fast
    tokenizer's Rust ``encode_batch_fast``, trusted if it matches a call on the first text."""
    texts = list(texts)
    if not texts:  # fast tokenizers raise IndexError on an empty batch
        return []
    backend = _plain_backend(tokenizer)
    if backend is None:
        return _call(tokenizer, texts)
    first = _call(tokenizer, texts[:1])[0]  # sets truncation, padding, special-token splitting
    ids = [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
    return ids if ids[0] == first else _call(tokenizer, texts)


@dataclass(frozen=True)
class Tokenized:
    """One data set's tokens, row for row with its frame."""

    table: pa.Table
    columns: tuple[str, ...]

    def __len__(self) -> int:
        return self.table.num_rows

    def lengths(self, column: str) -> np.ndarray:
        """Token count of each row's ``column`` (0 for a null), without EOS."""
        return self.table.column(f"{column}_len").to_numpy()

    def take(self, rows: np.ndarray) -> Tokenized:
        """The rows at ``rows`` (indices), in that order."""
        return Tokenized(self.table.take(pa.array(rows, type=pa.int64())), self.columns)

    def replace(self, column: str, rows: np.ndarray, texts: list[str], tokenizer) -> Tokenized:
        """Encode ``texts`` anew as ``column`` of ``rows`` (a cut prompt, a truncated
        response) and flag them in ``<column>_cut``."""
        table, n = self.table, self.table.num_rows
        flags = np.zeros(n, dtype=bool)
        flags[rows] = True
        if len(rows):
            fresh = _encoded(tokenizer, texts)
            where = np.arange(n)
            where[rows] = n + np.arange(len(rows))
            for name in ("ids", "len", "unk"):
                both = pa.concat_arrays([table.column(f"{column}_{name}").combine_chunks(),
                                         fresh[name]])
                table = table.set_column(table.schema.get_field_index(f"{column}_{name}"),
                                         f"{column}_{name}", both.take(pa.array(where)))
        return Tokenized(table.append_column(f"{column}_cut", pa.array(flags)), self.columns)


def _encoded(tokenizer, texts: list[str]) -> dict[str, pa.Array]:
    """ids, len, unk of ``texts``, in batches of BATCH."""
    unk = tokenizer.unk_token_id
    ids, lengths, unknown = [pa.array([], type=IDS)], [], []
    with tokenizer_threads():
        for start in range(0, len(texts), BATCH):
            batch = pa.array(encode_batch(tokenizer, texts[start: start + BATCH]), type=IDS)
            offsets = batch.offsets.to_numpy()
            ids.append(batch)
            lengths.append(np.diff(offsets).astype(np.int32))
            hits = np.concatenate([[0], np.cumsum(batch.values.to_numpy() == unk)])  # None: 0
            unknown.append((hits[offsets[1:]] - hits[offsets[:-1]]).astype(np.int32))
    return {"ids": pa.concat_arrays(ids),
            "len": pa.array(np.concatenate(lengths or [np.zeros(0, np.int32)])),
            "unk": pa.array(np.concatenate(unknown or [np.zeros(0, np.int32)]))}


def frame_texts(df: pd.DataFrame) -> dict[str, list[str]]:
    """Each text column of ``df``, '' for a null (no tokens, as the suites count it)."""
    return {col: [v if isinstance(v, str) else "" for v in df[col]]
            for col in TEXT_COLUMNS if col in df.columns}


def tokenize_frame(df: pd.DataFrame, tokenizer) -> Tokenized:
    """Every text column of ``df``, tokenized once."""
    texts = frame_texts(df)
    arrays: dict[str, pa.Array] = {}
    for col, strings in texts.items():
        for name, values in _encoded(tokenizer, strings).items():
            arrays[f"{col}_{name}"] = values
    return Tokenized(pa.table(arrays), tuple(texts))


def tokens_path(cleaned: Path | str) -> Path:
    """``data/sft.jsonl`` -> ``data/sft.tokens.arrow``."""
    cleaned = Path(cleaned)
    return cleaned.with_name(cleaned.stem + SUFFIX)


class TokenWriter:
    """Appends record batches of ``<c>_ids`` columns to ``path`` (written aside, renamed into
    place on a clean exit)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._tmp = self.path.with_name(self.path.name + ".part")
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._schema: pa.Schema | None = None

    def write(self, table: pa.Table) -> None:
        """Append the ``<c>_ids`` columns of a gate's token table."""
        table = table.select([n for n in table.column_names if n.endswith("_ids")])
        if self._writer is None:
            self._schema = pa.schema([pa.field(n, IDS) for n in table.column_names])
            self._writer = pa.ipc.new_file(str(self._tmp), self._schema)
        self._writer.write_table(table.cast(self._schema))

    def close(self) -> None:
        """Finish the file (nothing written: one without columns)."""
        if self._writer is None:
            self.write(pa.table({}))
        self._writer.close()
        self._tmp.replace(self.path)

    def __enter__(self) -> TokenWriter:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            return self.close()
        if self._writer is not None:
            self._writer.close()
        self._tmp.unlink(missing_ok=True)


def write_tokens(table: pa.Table, path: Path | str) -> None:
    """The whole token table of one cleaned set in one go."""
    with TokenWriter(path) as out:
        out.write(table)


def read_tokens(path: Path | str) -> pa.Table:
    """The token table of a cleaned set, memory-mapped (nothing read until used)."""
    source = pa.memory_map(str(path), "r")
    return pa.ipc.open_file(source).read_all()
