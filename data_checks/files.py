"""Reading one local data file: format and compression from the name, text decoded strictly.
Lines are split on "\\n" only (U+2028/U+2029 are legal inside JSON strings); only regular files
are read (a named pipe or a device would block).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from data_checks.errors import DataError

if TYPE_CHECKING:  # pandas is loaded by the readers, not by a caller of looks_local
    import pandas as pd

COMPRESSIONS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
FORMATS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
READ_ERRORS = (OSError, EOFError, lzma.LZMAError)


def lines_index(numbers: list[int]) -> pd.Index:
    """The index of rows read from 1-based file lines: label = line - 1."""
    import pandas as pd

    return pd.Index([n - 1 for n in numbers], dtype="int64")


def looks_local(value: str) -> bool:
    """A path on this machine rather than a hub dataset id."""
    p = Path(value)
    suffixes = [s.lower() for s in p.suffixes[-2:]]
    return (value.startswith(("/", "./", "../", "~", ".\\")) or value.count("/") > 1
            or "\\" in value or any(s in FORMATS or s in COMPRESSIONS for s in suffixes)
            or p.expanduser().exists())


def file_format(path: Path) -> tuple[str | None, str | None]:
    """'pairs.jsonl.gz' -> ('jsonl', '.gz'); unknown extension -> (None, compression)."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSIONS else None
    return (FORMATS.get(suffixes[-1]) if suffixes else None), compression


def check_regular(path: Path) -> None:
    if path.exists() and not path.is_file() and not path.is_dir():
        raise DataError(f"{path}: not a regular file (a named pipe, socket or device); copy the "
                        "data into a file")


def read_bytes(path: Path, compression: str | None) -> bytes:
    with opened(path, compression) as fh:
        return fh.read()


def _decoded_lines(path: Path, lines: Iterator[bytes]) -> Iterator[str]:
    """Each line as text (a byte-order mark skipped), or a DataError naming line and column."""
    for number, raw in enumerate(lines, start=1):
        try:
            yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as err:
            raise DataError(f"{path} line {number}: not valid UTF-8 (byte "
                            f"0x{raw[err.start]:02x} at column {err.start + 1})") from None


def decode(path: Path, data: bytes) -> str:
    return "\n".join(_decoded_lines(path, data.split(b"\n")))


@contextmanager
def opened(path: Path, compression: str | None) -> Iterator[BinaryIO]:
    """The file in binary, decompressed as it is read; an error reading it names the file."""
    check_regular(path)
    opener = COMPRESSIONS[compression] if compression else open
    try:
        with opener(path, "rb") as fh:
            yield fh
    except READ_ERRORS as err:
        raise DataError(f"{path}: cannot decompress as {compression} ({err})" if compression
                        else f"{path}: cannot read ({err})") from None


def iter_jsonl(path: Path, compression: str | None, rows: int) -> Iterator[pd.DataFrame]:
    """A JSONL file in DataFrames of ``rows`` rows read a line at a time, indexed by line."""
    import pandas as pd

    with opened(path, compression) as fh:
        batch, numbers, number = [], [], 0
        for number, line in enumerate(_decoded_lines(path, fh), start=1):
            if not line.strip():
                continue
            batch.append(_json_row(path, number, line))
            numbers.append(number)
            if len(batch) >= rows:
                yield pd.DataFrame(batch, index=lines_index(numbers))
                batch, numbers = [], []
        if number == 0:
            raise DataError(f"{path}: file is empty")
        if batch:
            yield pd.DataFrame(batch, index=lines_index(numbers))


def _json_row(path: Path, number: int, line: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(f"{path} line {number}: invalid JSON ({err.msg})") from None
    if not isinstance(row, dict):
        raise DataError(f"{path} line {number}: expected a JSON object")
    return row


def _csv_header(path: Path, names: list[str]) -> list[str]:
    dupes = sorted({name for name in names if names.count(name) > 1})
    if dupes:
        raise DataError(f"{path}: duplicate column names in the header: {', '.join(dupes)} "
                        "(each column must be named once)")
    return [name or f"Unnamed: {i}" for i, name in enumerate(names)]


def iter_csv(path: Path, compression: str | None, rows: int) -> Iterator[pd.DataFrame]:
    """A CSV file as DataFrames of ``rows`` rows read a line at a time, indexed by each row's
    first line (the header is line 1); cells as ``read_csv(dtype=str)`` gives them."""
    import pandas as pd
    from pandas._libs.parsers import STR_NA_VALUES  # what read_csv reads as missing, "" too

    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))  # long texts are data
    try:
        with opened(path, compression) as fh:
            reader = csv.reader(_decoded_lines(path, fh))
            header = None
            batch, starts, before, total = [], [], 0, 0
            for record in reader:
                start, before = before + 1, reader.line_num
                if not record:
                    continue  # a blank line
                if header is None:
                    header = _csv_header(path, record)
                    continue
                if len(record) > len(header):
                    raise DataError(f"{path} line {start}: cannot read as csv (expected "
                                    f"{len(header)} fields, saw {len(record)})")
                batch.append([None if v in STR_NA_VALUES else v for v in record]
                             + [None] * (len(header) - len(record)))
                starts.append(start)
                total += 1
                if len(batch) >= rows:
                    yield pd.DataFrame(batch, columns=header, index=lines_index(starts))
                    batch, starts = [], []
            if header is None:
                raise DataError(f"{path}: file is empty")
            if batch or not total:  # a header alone: no rows, its columns
                yield pd.DataFrame(batch, columns=header, index=lines_index(starts))
    except csv.Error as err:
        raise DataError(f"{path} line {reader.line_num}: cannot read as csv ({err})") from None


def read_local(path: Path, fmt: str, compression: str | None) -> pd.DataFrame:
    """A local file of format fmt -> DataFrame (a ``.json`` file holds one JSON array of
    objects, else JSON Lines); any failure is a :class:`DataError`."""
    import pandas as pd

    try:
        if fmt == "csv":  # one chunk of every row
            return next(iter_csv(path, compression, 2**62))
        if fmt != "jsonl":
            data = read_bytes(path, compression)
            if not data:
                raise DataError(f"{path}: file is empty")
            if fmt == "parquet":
                return pd.read_parquet(io.BytesIO(data))
            text = decode(path, data)
            if text.lstrip().startswith("["):
                try:
                    items = json.loads(text)
                except json.JSONDecodeError as err:
                    raise DataError(f"{path}: invalid JSON array (line {err.lineno}: {err.msg})") \
                        from None
                if not isinstance(items, list):
                    raise DataError(f"{path}: expected one JSON array of objects")
                for number, row in enumerate(items, start=1):
                    if not isinstance(row, dict):
                        raise DataError(f"{path} item {number}: expected a JSON object")
                return pd.DataFrame(items)
        # JSON Lines (a .json file without an array too): one chunk of every line
        return next(iter_jsonl(path, compression, 2**62), pd.DataFrame(index=lines_index([])))
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - pandas/pyarrow raise many types
        raise DataError(f"{path}: cannot read as {fmt} ({type(err).__name__}: {err})") from None


def write_cleaned(df: pd.DataFrame, path: Path, rows: int = 2_000,
                  append: bool = False) -> None:
    """``df.to_json(path, orient="records", lines=True)``, byte for byte, ``rows`` at a time
    (pandas builds the whole text in memory)."""
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        for start in range(0, max(len(df), 1), rows):  # an empty frame writes one newline
            fh.write(df.iloc[start: start + rows].to_json(orient="records", lines=True,
                                                          force_ascii=False))
