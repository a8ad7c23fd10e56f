"""Load SFT / preference / prompt data into one internal schema, with errors that name the
file and the row (never a raw traceback from inside a library). The frames are indexed so that
``label + 1`` is the row's line in a JSONL or CSV file, or its row in a Parquet file, JSON array
or dataset: every gate message shows that number.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from data_checks.adapters import COLUMNS, adapt, is_conversational, to_conversations
from data_checks.config import DataConfig, DataSource
from data_checks.errors import DataError
from data_checks.files import (
    check_regular,
    file_format,
    iter_csv,
    iter_jsonl,
    looks_local,
    opened,
    read_local,
)

# kept when present: a per-pair margin for the reward loss (reward.use_margin)
OPTIONAL_COLUMNS = {"preference": ["margin"]}


def _load_hf(source: DataSource):
    """A hub dataset or one saved with save_to_disk, memory-mapped, of the configured split."""
    import datasets

    path = Path(source.path)
    if looks_local(source.path) and not path.exists():  # a local path never goes to a hub
        raise DataError(f"{path}: file not found")
    check_regular(path)
    try:
        if path.is_dir() and any((path / f).exists()
                                 for f in ("dataset_info.json", "dataset_dict.json")):
            ds = datasets.load_from_disk(str(path))
        else:
            ds = datasets.load_dataset(source.path, split=source.split)
    except Exception as err:  # noqa: BLE001
        raise DataError(f"{source.path}: cannot load dataset ({type(err).__name__}: {err})") \
            from None
    if isinstance(ds, datasets.DatasetDict):
        if source.split not in ds:
            raise DataError(f"{source.path}: no split '{source.split}' (found: {list(ds)})")
        ds = ds[source.split]
    return ds


def load_table(source: DataSource, kind: str) -> pd.DataFrame:
    """Read ``source`` -> DataFrame with exactly the internal columns of ``kind``."""
    return _numbered_table(source, kind).reset_index(drop=True)


def _numbered_table(source: DataSource, kind: str) -> pd.DataFrame:
    """:func:`load_table`, indexed by the rows' places in the file."""
    if _streamed_format(source) is not None:
        return pd.concat(list(iter_table(source, kind, 2**62)))
    path = Path(source.path)
    if not path.exists() and looks_local(source.path):
        raise DataError(f"{path}: file not found")
    detected, compression = file_format(path)
    fmt = detected if source.format == "auto" else source.format
    if fmt is None:
        raise DataError(f"{path}: unknown data file type (use .jsonl, .json, .csv or "
                        ".parquet, optionally .gz/.bz2/.xz, or set format)")
    if path.is_dir():
        raise DataError(f"{path}: a folder, not a {fmt} file (name the file inside it; a "
                        "dataset saved with save_to_disk loads with format: hf)")
    df = read_local(path, fmt, compression)
    if df.empty:
        _schema(df.rename(columns=source.column_map), path)
        raise DataError(f"{path}: no rows")
    return _to_schema(df, source, kind, path)


def _schema(df: pd.DataFrame, path: Path) -> None:
    doubled = sorted({str(c) for c in df.columns[df.columns.duplicated()]})
    if doubled:
        raise DataError(f"{path}: after column_map, more than one column is named "
                        f"{', '.join(doubled)} (map one source column to each name)")


def _to_schema(df: pd.DataFrame, source: DataSource, kind: str, path: Path,
               chat: bool | None = None) -> pd.DataFrame:
    """Rows as read -> exactly the internal columns of ``kind``, the index kept; ``chat``:
    whether the rows are conversations (None: :func:`_is_chat` decides)."""
    df = df.rename(columns=source.column_map)
    _schema(df, path)
    if _is_chat(source, df) if chat is None else chat:
        return _margin(to_conversations(df.head(source.limit) if source.limit else df, kind,
                                        path), path)
    if source.style != "plain":
        df = adapt(df, source.style, kind, path)
    missing = [c for c in COLUMNS[kind] if c not in df.columns]
    if missing:
        raise DataError(f"{path}: missing column '{missing[0]}' "
                        f"(found: {', '.join(map(str, df.columns))})")
    keep = COLUMNS[kind] + [c for c in OPTIONAL_COLUMNS.get(kind, []) if c in df.columns]
    df = _margin(df[keep].head(source.limit) if source.limit else df[keep], path)
    for col in COLUMNS[kind]:
        bad = df[col].map(lambda v: v is not None and not isinstance(v, str) and v == v)
        if bad.any():
            row = bad.idxmax()
            raise DataError(f"{path} row {int(row) + 1}: field '{col}' must be a string, "
                            f"got {type(df[col].loc[row]).__name__}")
    return df


def _is_chat(source: DataSource, renamed: pd.DataFrame) -> bool:
    """Whether rows of ``source`` (columns mapped) are conversations, by style or content."""
    return source.style == "conversational" or (source.style == "plain"
                                                 and is_conversational(renamed))


def _streamed_format(source: DataSource) -> str | None:
    """How a source is read in chunks: "jsonl", "csv", "parquet" or "hf"; None: read whole."""
    path = Path(source.path).expanduser()
    detected, compression = file_format(path)
    fmt = detected if source.format == "auto" else source.format
    if fmt == "hf" or (fmt is None and not looks_local(source.path)):
        return "hf"
    if not path.is_file():
        return None
    return fmt if fmt in ("jsonl", "csv", "parquet") else None


def _raw_chunks(source: DataSource, fmt: str, rows: int) -> Iterator[pd.DataFrame]:
    """The source's rows as stored, ``rows`` at a time, indexed by their places."""
    path = Path(source.path).expanduser()
    compression = file_format(path)[1]
    if fmt == "jsonl":
        yield from iter_jsonl(path, compression, rows)
    elif fmt == "csv":
        yield from iter_csv(path, compression, rows)
    elif fmt == "hf":
        yield from _counted(_load_hf(source).to_pandas(batch_size=rows, batched=True))
    elif compression is None:
        check_regular(path)
        yield from _parquet_frames(path, path, rows)
    else:
        with tempfile.TemporaryDirectory(prefix="rlhf-parquet-") as folder:
            plain = Path(folder) / path.stem  # pairs.parquet.gz -> pairs.parquet
            with opened(path, compression) as src, open(plain, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            yield from _parquet_frames(plain, path, rows)


def _parquet_frames(path: Path, named: Path, rows: int) -> Iterator[pd.DataFrame]:
    """A Parquet file ``rows`` rows at a time, errors naming ``named`` (no pre-buffering: it
    keeps every row group read until closed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parts = pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=rows)
        yield from _counted(pa.Table.from_batches([batch]).to_pandas() for batch in parts)
    except Exception as err:  # noqa: BLE001 - pyarrow raises many types
        raise DataError(f"{named}: cannot read as parquet ({type(err).__name__}: {err})") \
            from None


def _counted(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Frames of successive rows, indexed by their row in the whole (0-based)."""
    seen = 0
    for frame in frames:
        frame.index = pd.RangeIndex(seen, seen + len(frame))
        seen += len(frame)
        yield frame


def iter_table(source: DataSource, kind: str, rows: int,
               table: pd.DataFrame | None = None) -> Iterator[pd.DataFrame]:
    """``load_table(source, kind)`` in chunks of ``rows`` rows, each checked as it comes and
    indexed by the file's rows (a JSON file is read whole and sliced; ``table``: the source
    already read so)."""
    fmt = _streamed_format(source) if table is None else None
    if fmt is None:
        table = _numbered_table(source, kind) if table is None else table
        for start in range(0, len(table), rows):
            yield table.iloc[start: start + rows]
        return
    path = Path(source.path).expanduser() if fmt != "hf" else Path(source.path)
    seen, columns, chat = 0, None, None
    for chunk in _raw_chunks(source, fmt, rows):
        if columns is None:
            columns = list(chunk.columns)
        else:  # a key missing from every row of a chunk is null there, as in one read
            columns += [c for c in chunk.columns if c not in columns]
            chunk = chunk.reindex(columns=columns)
        if chat is None:  # the first chunk says for the whole set
            chat = _is_chat(source, chunk.rename(columns=source.column_map))
        if source.limit:
            chunk = chunk.head(source.limit - seen)
        table = _to_schema(chunk, source, kind, path, chat)
        seen += len(table)
        yield table
        if source.limit and seen >= source.limit:
            return
    if seen == 0:
        raise DataError(f"{path}: no rows")


def _margin(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    """``df`` with its ``margin`` column (if any) as finite floats, else a DataError naming the
    rows that are not."""
    if "margin" not in df.columns:
        return df

    def as_float(value) -> float | None:
        if isinstance(value, bool):
            return None
        try:
            number = float(value)
        except (TypeError, ValueError):
            return None
        return number if math.isfinite(number) else None

    values = df["margin"].map(as_float)
    bad = [row for row, v in values.items() if v is None or v != v]  # None: NaN
    if bad:
        shown = ", ".join(str(int(r) + 1) for r in bad[:5]) + (" ..." if len(bad) > 5 else "")
        raise DataError(f"{path}: column 'margin' must hold finite numbers; {len(bad)} rows "
                        f"do not: rows {shown} (e.g. {df['margin'].loc[bad[0]]!r})")
    df["margin"] = values.astype(float)
    return df


# each data set of a DataConfig -> its schema (loading, validation and the preflight read)
KINDS = {"sft": "sft", "preference": "preference", "prompts": "prompts",
         "eval_prompts": "prompts", "preference_eval": "preference"}


@dataclass(frozen=True)
class ReadKey:
    """One local file as read: the source's settings, its schema and the file's identity."""

    source: str  # DataSource as JSON
    kind: str
    path: str
    size: int
    mtime_ns: int


# files read ahead by read_every_source, each handed once to the gate (take_read) so that a
# file is parsed once per command, not once before Prefect starts and again in the gate
_READ: dict[ReadKey, pd.DataFrame] = {}


def _read_key(source: DataSource, kind: str) -> ReadKey | None:
    path = Path(source.path).expanduser()
    if not path.is_file():  # a hub dataset or a folder: read where it is used
        return None
    stat = path.stat()
    return ReadKey(source.model_dump_json(), kind, str(path.resolve()), stat.st_size,
                   stat.st_mtime_ns)


def take_chunks(source: DataSource, kind: str, rows: int) -> Iterator[pd.DataFrame]:
    """:func:`iter_table`, from the table read_every_source kept when there is one."""
    key = _read_key(source, kind)
    yield from iter_table(source, kind, rows, _READ.pop(key, None) if key is not None else None)


def forget_reads() -> None:
    """Drop the tables read ahead and not taken (a reused validation never reads them)."""
    _READ.clear()


# a local file larger than this is not kept by read_every_source: its first chunk is checked
# there, the rest as the gate streams it (same errors, naming the line)
KEEP_BYTES = 32 * 2**20
FIRST_ROWS = 2_000


def read_every_source(data: DataConfig | None) -> None:
    """Read every source once so a malformed file fails before Prefect or MLflow start; the
    tables wait for the gate. A streamable file over KEEP_BYTES, or a dataset, is checked only
    up to FIRST_ROWS rows here."""
    if data is None:
        return
    for name, kind in KINDS.items():
        source = getattr(data, name)
        if source is None:
            continue
        key = _read_key(source, kind)
        if _streamed_format(source) is not None and (key is None or key.size > KEEP_BYTES):
            next(iter_table(source, kind, FIRST_ROWS), None)
            continue
        table = _numbered_table(source, kind)
        if key is not None:
            _READ[key] = table
