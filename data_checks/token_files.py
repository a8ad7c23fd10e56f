"""The gate's token ids on disk, so the stages read them memory-mapped instead of tokenizing
again: ``data/<name>.jsonl`` has ``data/<name>.tokens.arrow`` beside it, an Arrow IPC file with
one ``<c>_ids`` column per text column, row for row.
"""

from __future__ import annotations

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
