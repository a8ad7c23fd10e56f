"""TRL's conversational data formats -> prompt messages + reply strings, rendered with the chat
template. A column of ``{"role", "content"}`` message lists marks a data set as conversational;
a plain string prompt is then one user message. Errors name the file, the row and the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from data_checks.adapters import TEXT_FIELDS, AdapterError, as_list, map_rows
from data_checks.errors import DataError

ROLES = ("system", "user", "assistant", "tool")
MESSAGE_COLUMNS = ("messages", "prompt", "completion", "chosen", "rejected")


def _is_messages(value) -> bool:
    value = as_list(value)
    return isinstance(value, list | tuple) and len(value) > 0 and \
        all(isinstance(m, dict) and "role" in m for m in value)


def is_conversational(df: pd.DataFrame) -> bool:
    """Whether any message column's first non-null value is a list of messages."""
    for col in MESSAGE_COLUMNS:
        if col in df.columns:
            first = df[col].dropna()
            if len(first) and _is_messages(first.iloc[0]):
                return True
    return False


def messages(value, field: str) -> list[dict]:
    """A list of {role, content} messages (a plain string is one user message)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    value = as_list(value)
    if not isinstance(value, list | tuple) or not value:
        raise AdapterError(f"field '{field}' must be a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        m = dict(m) if isinstance(m, dict) else m
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
        chosen, rejected = messages(row["chosen"], "chosen"), messages(row["rejected"],
                                                                        "rejected")
        prompt, reply = _split_last(chosen, "chosen")
        other_prompt, other = _split_last(rejected, "rejected")
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
