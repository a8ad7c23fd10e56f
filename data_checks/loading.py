"""Load SFT / preference / prompt data into one internal schema, with errors that name the
file and the line or column (never a raw traceback from inside a library)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from data_checks.adapters import AdapterError, adapt
from data_checks.config import DataSource

COLUMNS = {"sft": ["prompt", "response"], "preference": ["prompt", "chosen", "rejected"],
           "prompts": ["prompt"]}
# kept when present: a per-pair margin for the reward loss (reward.use_margin)
OPTIONAL_COLUMNS = {"preference": ["margin"]}


class DataError(ValueError):
    """Malformed input; the message names the file and the line, row or column."""


def _read_jsonl(path: Path) -> pd.DataFrame:
    rows = []
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not valid UTF-8 (byte 0x{err.object[err.start]:02x} at "
                        f"offset {err.start})") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path} line {number}: invalid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path} line {number}: expected a JSON object")
        rows.append(row)
    return pd.DataFrame(rows)


def _read_file(source: DataSource, path: Path) -> pd.DataFrame:
    fmt = source.format
    if fmt == "auto":
        fmt = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv",
               ".parquet": "parquet"}.get(path.suffix.lower(), "hf")
    if fmt != "hf" and path.is_file() and path.stat().st_size == 0:
        raise DataError(f"{path}: file is empty")
    try:
        if fmt == "jsonl":
            return _read_jsonl(path)
        if fmt == "csv":
            return pd.read_csv(path, dtype=str, keep_default_na=True, encoding="utf-8")
        if fmt == "parquet":
            return pd.read_parquet(path)
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not valid UTF-8 ({err.reason} at offset {err.start})") from None
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - pandas/pyarrow raise many types
        raise DataError(f"{path}: cannot read as {fmt} ({type(err).__name__}: {err})") from None
    return _read_hf(source)


def _read_hf(source: DataSource) -> pd.DataFrame:
    import datasets

    path = Path(source.path)
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
    return ds.to_pandas()


def load_table(source: DataSource, kind: str) -> pd.DataFrame:
    """Read ``source`` -> DataFrame with exactly the internal columns of ``kind``."""
    path = Path(source.path)
    if source.format != "hf" and not path.exists() and path.suffix:
        raise DataError(f"{path}: file not found")
    df = _read_file(source, path).rename(columns=source.column_map)
    if df.empty:
        raise DataError(f"{path}: no rows")
    if source.style != "plain":
        try:
            df = adapt(df, source.style, kind, path)
        except AdapterError as err:
            raise DataError(str(err)) from None
    missing = [c for c in COLUMNS[kind] if c not in df.columns]
    if missing:
        raise DataError(f"{path}: missing column '{missing[0]}' "
                        f"(found: {', '.join(map(str, df.columns))})")
    keep = COLUMNS[kind] + [c for c in OPTIONAL_COLUMNS.get(kind, []) if c in df.columns]
    df = df[keep].head(source.limit) if source.limit else df[keep]
    if "margin" in df.columns:
        df["margin"] = finite_numbers(df["margin"], path, "margin")
    for col in COLUMNS[kind]:
        bad = df[col].map(lambda v: v is not None and not isinstance(v, str) and v == v)
        if bad.any():
            row = int(bad.idxmax())
            raise DataError(f"{path} row {row + 1}: field '{col}' must be a string, got "
                            f"{type(df[col].iloc[row]).__name__}")
    return df.reset_index(drop=True)


def finite_numbers(column: pd.Series, path: Path, name: str) -> pd.Series:
    """A column of finite numbers as floats, else a DataError naming the rows that are not."""
    import math

    def as_float(value) -> float | None:
        if isinstance(value, bool):
            return None
        try:
            number = float(value)
        except (TypeError, ValueError):
            return None
        return number if math.isfinite(number) else None

    values = column.map(as_float)
    bad = [i + 1 for i, v in enumerate(values) if v is None or v != v]  # None may turn NaN
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
        raise DataError(f"{path}: column '{name}' must hold finite numbers; {len(bad)} rows "
                        f"do not: rows {shown} (e.g. {column.iloc[bad[0] - 1]!r})")
    return values.astype(float)
