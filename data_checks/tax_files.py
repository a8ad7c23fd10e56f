"""The alignment tax's inputs through the gate: a probe of questions with accepted answers, and
held-out general text (``eval.tax.probe``, ``eval.tax.text``). A bad file is refused before
any training, naming the file and the row; rows are named as the file has them (a JSONL row by
its line, a CSV row by its line, a text paragraph by its first line)."""

from __future__ import annotations

from pathlib import Path

from data_checks.errors import DataError
from data_checks.files import decode, file_format, read_bytes, read_local

MAX_TEXT_CHARS = 20_000  # one text row; longer held-out text is split into paragraphs


def _table(path: Path, what: str):
    fmt, compression = file_format(path)
    if fmt is None:
        raise DataError(f"{what} {path}: unknown format (expected .jsonl, .json, .csv or "
                        ".parquet{', or .txt' if what == 'eval.tax.text' else ''})")
    if not path.is_file():
        raise DataError(f"{what} {path}: no such file")
    try:
        return read_local(path, fmt, compression)
    except DataError as err:
        raise DataError(f"{what}: {err}") from None


def _row(index, path: Path) -> str:
    return f"{path} row {int(index) + 1}"


def _answers(value, where: str) -> list[str]:
    if isinstance(value, str):
        value = value.split("|")
    if not isinstance(value, list | tuple) and hasattr(value, "tolist"):
        value = value.tolist()
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
    df = _table(path, "eval.tax.probe")
    missing = [c for c in ("question", "answers") if c not in df.columns]
    if missing:
        raise DataError(f"eval.tax.probe {path}: no {' or '.join(missing)} column (columns: "
                        f"{', '.join(map(str, df.columns))})")
    if df.empty:
        raise DataError(f"eval.tax.probe {path}: no questions")
    out, seen = [], {}
    for index, row in df.iterrows():
        where, question = _row(index, path), row["question"]
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


def read_text(path: str | Path) -> list[str]:
    """Held-out text -> its rows: a .txt file's paragraphs (split at blank lines), or a table's
    ``text`` column; DataError naming the file and row for an empty file, binary data or a
    row over ``MAX_TEXT_CHARS``."""
    path = Path(path).expanduser()
    if path.suffix.lower() == ".txt":
        if not path.is_file():
            raise DataError(f"eval.tax.text {path}: no such file")
        try:
            text = decode(path, read_bytes(path, None))
        except DataError as err:
            raise DataError(f"eval.tax.text: {err}") from None
        rows, block, start = [], [], 0
        for number, line in enumerate([*text.split("\n"), ""], start=1):
            if line.strip():
                start, block = start or number, [*block, line]
            elif block:
                rows.append(_check_text("\n".join(block), f"{path} line {start}"))
                block, start = [], 0
        if not rows:
            raise DataError(f"eval.tax.text {path}: file is empty")
        return rows
    df = _table(path, "eval.tax.text")
    if "text" not in df.columns:
        raise DataError(f"eval.tax.text {path}: no text column (columns: "
                        f"{', '.join(map(str, df.columns))})")
    if df.empty:
        raise DataError(f"eval.tax.text {path}: no rows")
    return [_check_text(row, _row(index, path)) for index, row in df["text"].items()]
