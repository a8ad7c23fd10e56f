"""The gate's token ids on disk, so the stages read them memory-mapped instead of tokenizing
again: ``data/<name>.jsonl`` has ``data/<name>.tokens.arrow`` beside it, an Arrow IPC file with
one ``<c>_ids`` column per text column, row for row; and the tokenized chunks a gate keeps.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

import pyarrow as pa

SUFFIX = ".tokens.arrow"
IDS = pa.list_(pa.int32())


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
            self.close()
        else:
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


class ChunkTokens:
    """Tokenized chunks, ``<folder>/<key>.arrow`` keyed by their texts and ``salt`` (the
    encoding's identity), so a rerun gate or a retrain round tokenizes only new or changed
    chunks. A read sets the file's modification time, which ``rlhf gc`` ages by."""

    def __init__(self, folder: Path | str, salt: str):
        self.folder = Path(folder)
        self.salt = salt.encode()

    def key(self, texts: dict[str, list[str]]) -> str:
        h = hashlib.sha256(self.salt)
        for column, values in texts.items():
            array = pa.array(values, type=pa.large_string())
            h.update(b"\0" + column.encode() + b"\0" + str(len(array)).encode())
            for buffer in array.buffers()[1:]:  # offsets, then the text's bytes
                if buffer is not None:
                    h.update(buffer)
        return h.hexdigest()

    def file(self, key: str) -> Path:
        return self.folder / f"{key}.arrow"

    def get(self, key: str) -> pa.Table | None:
        """The table kept under ``key``, or None."""
        path = self.file(key)
        try:
            reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
            if (reader.schema.metadata or {}).get(b"rlhf.key") != key.encode():
                return None
            table = reader.read_all().replace_schema_metadata(None)
            os.utime(path)  # last used now
        except (OSError, pa.ArrowInvalid):
            return None
        return table

    def put(self, key: str, table: pa.Table) -> None:
        path = self.file(key)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
        self.folder.mkdir(parents=True, exist_ok=True)
        table = table.replace_schema_metadata({"rlhf.key": key})
        try:
            with pa.ipc.new_file(str(tmp), table.schema) as out:
                out.write_table(table)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
