"""Adapters from well-known preference formats to the internal schema: Anthropic-HH transcripts
and TL;DR comparisons. Errors name the file, row and field.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from data_checks.errors import DataError

# the internal schema: each kind's columns, and its replies (every column but the prompt)
COLUMNS = {"sft": ["prompt", "response"], "preference": ["prompt", "chosen", "rejected"],
           "prompts": ["prompt"]}
TEXT_FIELDS = {kind: columns[1:] for kind, columns in COLUMNS.items()}

ASSISTANT = "\n\nAssistant:"
TLDR_TEMPLATE = "SUBREDDIT: r/{subreddit}\n\nTITLE: {title}\n\nPOST: {post}\n\nTL;DR:"


class AdapterError(DataError):
    """A row that does not fit the declared style (:func:`map_rows` names the file and row)."""


def split_hh(chosen: str, rejected: str) -> tuple[str, str, str]:
    """Two transcripts -> (shared prompt ending in 'Assistant:', chosen reply, rejected reply)."""
    common = os.path.commonprefix([chosen, rejected])
    cut = common.rfind(ASSISTANT)
    if cut < 0:
        if ASSISTANT not in chosen or ASSISTANT not in rejected:
            raise AdapterError("transcript has no '\\n\\nAssistant:' turn")
        raise AdapterError("chosen and rejected share no dialogue up to an Assistant turn")
    end = cut + len(ASSISTANT)
    return chosen[:end], chosen[end:], rejected[end:]


def as_list(value):
    """``value``, a numpy array (as parquet and datasets give lists) as a list."""
    return value.tolist() if hasattr(value, "tolist") else value


def _field(row: dict, name: str, where: str = "") -> str:
    value = row.get(name) if isinstance(row, dict) else None
    if not isinstance(value, str):
        raise AdapterError(f"field '{where}{name}' missing or not a string")
    return value


def tldr_prompt(info: dict, where: str = "") -> str:
    return TLDR_TEMPLATE.format(subreddit=_field(info, "subreddit", where),
                                title=_field(info, "title", where),
                                post=_field(info, "post", where))


def _tldr_row(row: dict, kind: str) -> dict:
    if kind != "preference":
        info = row["info"] if isinstance(row.get("info"), dict) else row
        out = {"prompt": tldr_prompt(info, "info." if info is not row else "")}
        if kind == "sft":
            out["response"] = _field(row, "summary")
        return out
    if not isinstance(row.get("info"), dict):
        raise AdapterError("field 'info' missing or not an object")
    summaries = as_list(row.get("summaries"))
    if not isinstance(summaries, (list, tuple)) or len(summaries) != 2 or \
            not all(isinstance(s, dict) and isinstance(s.get("text"), str) for s in summaries):
        raise AdapterError("field 'summaries' must hold two summaries with a 'text'")
    choice = row.get("choice")
    if choice not in (0, 1) or isinstance(choice, bool):
        raise AdapterError(f"field 'choice' must be 0 or 1, got {choice!r}")
    return {"prompt": tldr_prompt(row["info"], "info."),
            "chosen": summaries[choice]["text"], "rejected": summaries[1 - choice]["text"]}


def _hh_row(row: dict, kind: str) -> dict:
    if kind == "preference":
        prompt, chosen, rejected = split_hh(_field(row, "chosen"), _field(row, "rejected"))
        return {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    text = _field(row, "chosen" if "chosen" in row else "text")  # one transcript
    cut = text.rfind(ASSISTANT)
    if cut < 0:
        raise AdapterError("transcript has no '\\n\\nAssistant:' turn")
    end = cut + len(ASSISTANT)  # the prompt: the dialogue up to the last Assistant turn
    prompt, reply = text[:end], text[end:]
    return {"prompt": prompt, "response": reply} if kind == "sft" else {"prompt": prompt}


def map_rows(df: pd.DataFrame, convert, kind: str, path: Path, what: str) -> pd.DataFrame:
    """``convert(row, kind)`` over every row, the index kept; a ValueError becomes an
    AdapterError naming the file, the row and ``what`` the rows were read as."""
    rows = []
    for label, row in zip(df.index, df.to_dict(orient="records")):
        try:
            rows.append(convert(row, kind))
        except ValueError as err:
            raise AdapterError(f"{path} row {int(label) + 1} ({what}): {err}") from None
    return pd.DataFrame(rows, index=df.index)


def adapt(df: pd.DataFrame, style: str, kind: str, path: Path) -> pd.DataFrame:
    """Rows of ``style`` -> internal columns of ``kind``; DataError-ready messages."""
    convert = {"hh": _hh_row, "tldr": _tldr_row}[style]
    return map_rows(df, convert, kind, path, f"{style} style")
