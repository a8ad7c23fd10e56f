"""Adapters from well-known data formats to the internal schema: Anthropic-HH transcripts, TL;DR
comparisons and TRL's conversational formats. A column of ``{"role", "content"}`` message lists
marks a data set as conversational (a plain string prompt is then one user message); its rows are
rendered with the chat template. Errors name the file, the row and the field.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from data_checks.errors import DataError

# the internal schema: each kind's columns, and its replies (every column but the prompt)
COLUMNS = {"sft": ["prompt", "response"], "preference": ["prompt", "chosen", "rejected"],
           "prompts": ["prompt"]}
TEXT_FIELDS = {kind: columns[1:] for kind, columns in COLUMNS.items()}

ASSISTANT = "\n\nAssistant:"
TLDR_TEMPLATE = "SUBREDDIT: r/{subreddit}\n\nTITLE: {title}\n\nPOST: {post}\n\nTL;DR:"
ROLES = ("system", "user", "assistant", "tool")
MESSAGE_COLUMNS = ("messages", "prompt", "completion", "chosen", "rejected")


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
    prompt, reply, _ = split_hh(text, text)  # the dialogue up to the last Assistant turn
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


def _is_messages(value) -> bool:
    value = as_list(value)
    return isinstance(value, list | tuple) and len(value) > 0 and \
        all(isinstance(m, dict) and "role" in m for m in value)


def is_conversational(df: pd.DataFrame) -> bool:
    """Whether any message column's first non-null value is a list of messages."""
    firsts = (df[col].dropna() for col in MESSAGE_COLUMNS if col in df.columns)
    return any(len(first) and _is_messages(first.iloc[0]) for first in firsts)


def messages(value, field: str) -> list[dict]:
    """A list of {role, content} messages (a plain string is one user message)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    value = as_list(value)
    if not isinstance(value, list | tuple) or not value:
        raise AdapterError(f"field '{field}' must be a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES or \
                not isinstance(m.get("content"), str):
            raise AdapterError(f"field '{field}' message {i + 1} must have a role "
                               f"({'/'.join(ROLES)}) and a string content, got {m!r}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _reply(value, field: str) -> str:
    """An assistant reply: a string, a message, or a list of exactly one assistant message."""
    if isinstance(value, str):
        return value
    value = as_list(value)
    msgs = messages([value] if isinstance(value, dict) else value, field)
    if len(msgs) != 1 or msgs[0]["role"] != "assistant":
        raise AdapterError(f"field '{field}' must be one assistant message, got "
                           f"{[m['role'] for m in msgs]}")
    return msgs[0]["content"]


def _split_last(conv: list[dict], field: str) -> tuple[list[dict], str]:
    if len(conv) < 2 or conv[-1]["role"] != "assistant":
        raise AdapterError(f"field '{field}' must end with an assistant message after "
                           "at least one other message")
    return conv[:-1], conv[-1]["content"]


def _preference(row: dict) -> dict:
    if _is_messages(row.get("prompt")) or not (_is_messages(row.get("chosen"))
                                               and as_list(row["chosen"])[0].get("role")
                                               != "assistant"):
        out = {"prompt": messages(row.get("prompt"), "prompt"),
               "chosen": _reply(row.get("chosen"), "chosen"),
               "rejected": _reply(row.get("rejected"), "rejected")}
    else:  # implicit prompt: two whole conversations
        prompt, reply = _split_last(messages(row["chosen"], "chosen"), "chosen")
        other_prompt, other = _split_last(messages(row["rejected"], "rejected"), "rejected")
        if prompt != other_prompt:
            raise AdapterError("chosen and rejected must share every message but their "
                               "last (implicit prompt)")
        out = {"prompt": prompt, "chosen": reply, "rejected": other}
    if row.get("margin") is not None:  # a plain data set's own margin column
        out["margin"] = row["margin"]
    if "score_chosen" in row and "score_rejected" in row:
        try:
            out["margin"] = float(row["score_chosen"]) - float(row["score_rejected"])
        except (TypeError, ValueError):
            raise AdapterError("fields 'score_chosen'/'score_rejected' must be numbers") \
                from None
    return out


def _row(row: dict, kind: str) -> dict:
    if kind == "preference":
        return _preference(row)
    if kind == "sft":
        if row.get("messages") is not None and row.get("prompt") is None:
            prompt, reply = _split_last(messages(row["messages"], "messages"), "messages")
            return {"prompt": prompt, "response": reply}
        reply = row.get("completion", row.get("response"))
        return {"prompt": messages(row.get("prompt"), "prompt"),
                "response": _reply(reply, "completion")}
    if row.get("prompt") is None and row.get("messages") is not None:
        conv = messages(row["messages"], "messages")
        conv = conv[:-1] if conv[-1]["role"] == "assistant" and len(conv) > 1 else conv
        return {"prompt": conv}
    return {"prompt": messages(row.get("prompt"), "prompt")}


def to_conversations(df: pd.DataFrame, kind: str, path: Path) -> pd.DataFrame:
    """Rows of any recognised format -> prompt (messages) and reply columns of ``kind``."""
    return map_rows(df, _row, kind, path, "conversational")


def _no_markers(prompt: list[dict], replies: list[str], markers: list[str]) -> None:
    """Message text must not hold the template's end-of-turn or PAD token literally."""
    for text in [m["content"] for m in prompt] + replies:
        for marker in markers:
            if marker in text:
                raise AdapterError(f"a message holds the token {marker!r} literally (it "
                                   "would end or mask the turn); remove or escape it")


def _render_frame(df: pd.DataFrame, kind: str, tokenizer, chat, eot: str,
                  where: str) -> pd.DataFrame:
    """Conversational rows -> rendered prompt and reply strings, in one go (row by row only to
    find a row the template refuses)."""
    rows, cols = df.to_dict(orient="records"), TEXT_FIELDS[kind]
    markers = [t for t in (eot, tokenizer.pad_token) if t]
    prompts, replies = [], {col: [] for col in cols}
    for label, row in zip(df.index, rows):
        with _named(where, label):
            prompt = messages(row["prompt"], "prompt")
            answers = [_reply(row[col], col) for col in cols]
            _no_markers(prompt, answers, markers)
        prompts.append(prompt)
        for col, answer in zip(cols, answers):
            replies[col].append(answer)
    try:
        texts = chat.render_many(tokenizer, prompts, True)
        wholes = {col: chat.render_many(tokenizer, [[*p, {"role": "assistant", "content": r}]
                                                    for p, r in zip(prompts, replies[col])],
                                        False) for col in cols}
    except ValueError:  # a conversation the template refuses: found row by row below
        texts = wholes = None
    out = []
    for i, (label, row) in enumerate(zip(df.index, rows)):
        with _named(where, label):
            text = texts[i] if texts else chat.render_prompt(tokenizer, prompts[i])
            chat.check_bos(tokenizer, text, prompts[i])
            row = {**row, "prompt": text}
            for col in cols:
                row[col] = chat.reply_text(tokenizer, wholes[col][i], text, eot) if wholes \
                    else chat.render_reply(tokenizer, prompts[i], replies[col][i], text, eot)
        out.append(row)
    return pd.DataFrame(out, columns=df.columns, index=df.index)


@contextmanager
def _named(where: str, label) -> Iterator[None]:
    """A ValueError in the block becomes an AdapterError naming the file and the row."""
    try:
        yield
    except ValueError as err:
        raise AdapterError(
            f"{where} row {int(label) + 1}: {err}. Fix the row, or set model.chat_template "
            "to a template that renders it") from None


def start_chat(tokenizer, chat, where: str) -> dict:
    """Ready ``tokenizer`` for conversations once per gate (the template checked, EOS its
    end-of-turn token) -> what it did; else a DataError."""
    if chat is None:
        raise DataError(f"{where}: conversational data needs a chat renderer")
    try:
        return chat.prepare_chat(tokenizer)
    except ValueError as err:
        raise DataError(f"{where}: conversational data, but {err}") from None


def render_chunks(chunks: Iterable[pd.DataFrame], kind: str, tokenizer, chat, info: dict,
                  where: str, converted: bool) -> Iterator[pd.DataFrame]:
    """One data set's chunks rendered with the chat template (``converted``: rows are already
    messages and replies; else plain rows)."""
    for df in chunks:
        if not converted:
            df = to_conversations(df, kind, where)
        yield _render_frame(df, kind, tokenizer, chat, info["end_of_turn"], where)
