"""The alignment tax's inputs through the gate: a probe of questions with accepted answers and
held-out general text (``eval.tax.probe``, ``eval.tax.text``), and the pretraining-mix text
(``data.pretrain``). A bad file is refused before any training, naming the setting, the file and
the row as the file has it (a JSONL or CSV row by its line, a text paragraph by its first line)."""

from __future__ import annotations

from pathlib import Path

from data_checks.adapters import as_list
from data_checks.errors import DataError
from data_checks.files import decode, file_format, read_bytes, read_local

MAX_TEXT_CHARS = 20_000  # one text row; longer held-out text is split into paragraphs


def _table(path: Path, setting: str, columns: tuple[str, ...], nothing: str):
    """The table at ``path``, with ``columns`` and a row at least; else a DataError naming
    ``setting`` and the file (``nothing``: what an empty table lacks)."""
    fmt, compression = file_format(path)
    if fmt is None:
        raise DataError(f"{setting} {path}: unknown format (expected .jsonl, .json, .csv or "
                        f".parquet{'' if setting == 'eval.tax.probe' else ', or .txt'})")
    if not path.is_file():
        raise DataError(f"{setting} {path}: no such file")
    try:
        df = read_local(path, fmt, compression)
    except DataError as err:
        raise DataError(f"{setting}: {err}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataError(f"{setting} {path}: no {' or '.join(missing)} column (columns: "
                        f"{', '.join(map(str, df.columns))})")
    if df.empty:
        raise DataError(f"{setting} {path}: {nothing}")
    return df


def _answers(value, where: str) -> list[str]:
    value = value.split("|") if isinstance(value, str) else as_list(value)
    if not isinstance(value, list | tuple) or not all(isinstance(a, str) for a in value):
        raise DataError(f"{where}: 'answers' must be a list of strings (or strings joined "
                        f"by |), got {type(value).__name__}")
    out = [a.strip() for a in value if a.strip()]
    if not out:
        raise DataError(f"{where}: no accepted answer")
    return out


def read_probe(path: str | Path) -> list[tuple[str, list[str], str]]:
    """A probe file -> [(question, accepted answers, category)]; DataError naming the file and
    row for a missing column, an empty question or answer list, or a repeated question."""
    path = Path(path).expanduser()
    df = _table(path, "eval.tax.probe", ("question", "answers"), "no questions")
    out, seen = [], {}
    for index, row in df.iterrows():
        where, question = f"{path} row {int(index) + 1}", row["question"]
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{where}: empty question")
        if question.strip() in seen:
            raise DataError(f"{where}: the question of row {seen[question.strip()]} again")
        seen[question.strip()] = int(index) + 1
        category = row.get("category", "")
        out.append((question.strip(), _answers(row["answers"], where),
                    category if isinstance(category, str) else ""))
    return out


def _check_text(text, where: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise DataError(f"{where}: empty text")
    if "\x00" in text:
        raise DataError(f"{where}: binary data (a NUL byte); give plain text")
    if len(text) > MAX_TEXT_CHARS:
        raise DataError(f"{where}: {len(text)} characters in one row (at most "
                        f"{MAX_TEXT_CHARS}); split it into paragraphs")
    return text.strip()


def read_text(path: str | Path, setting: str = "eval.tax.text") -> list[str]:
    """Text -> its rows: a .txt file's paragraphs (split at blank lines), or a table's ``text``
    column; DataError naming ``setting`` (the one that gave the file), the file and the row for
    an empty file, binary data or a row over ``MAX_TEXT_CHARS``."""
    path = Path(path).expanduser()
    if path.suffix.lower() != ".txt":
        df = _table(path, setting, ("text",), "no rows")
        return [_check_text(row, f"{path} row {int(index) + 1}")
                for index, row in df["text"].items()]
    if not path.is_file():
        raise DataError(f"{setting} {path}: no such file")
    try:
        text = decode(path, read_bytes(path, None))
    except DataError as err:
        raise DataError(f"{setting}: {err}") from None
    rows, block, start = [], [], 0
    for number, line in enumerate([*text.split("\n"), ""], start=1):
        if line.strip():
            start, block = start or number, [*block, line]
        elif block:
            rows.append(_check_text("\n".join(block), f"{path} line {start}"))
            block, start = [], 0
    if not rows:
        raise DataError(f"{setting} {path}: file is empty")
    return rows
