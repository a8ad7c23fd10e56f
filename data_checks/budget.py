"""The length budget: prompts over it are cut at the last paragraph boundary that fits, else
dropped; responses over it dropped or truncated. It reads the token lengths the gate made once
(data_checks/tokens.py); only a cut prompt's head or a truncated response is tokenized again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from data_checks.config import ValidationConfig
from data_checks.tokens import Tokenized, encode_batch

TEXT_FIELDS = {"sft": ["response"], "preference": ["chosen", "rejected"], "prompts": []}


@dataclass(frozen=True)
class BudgetCounts:
    """What the budget did to one data set."""

    n_in: int
    n_truncated: int
    n_dropped: int

    @property
    def truncated_fraction(self) -> float:
        return self.n_truncated / max(self.n_in, 1)

    @property
    def dropped_fraction(self) -> float:
        return self.n_dropped / max(self.n_in, 1)

    def stats(self, name: str) -> dict[str, float]:
        """``<name>/n_in`` ... ``<name>/dropped_fraction``: the validate stage's metrics."""
        return {f"{name}/{k}": float(v) for k, v in (
            ("n_in", self.n_in), ("n_truncated", self.n_truncated),
            ("n_dropped", self.n_dropped), ("truncated_fraction", self.truncated_fraction),
            ("dropped_fraction", self.dropped_fraction))}


def _count(tokenizer, text: str) -> int:
    return len(encode_batch(tokenizer, [text])[0])


def cut_at_paragraph(prompt: str, tokenizer, max_tokens: int) -> str | None:
    """The longest head of ``prompt`` ending before a newline that fits the budget (TL;DR
    recipe), else None. The whole prompt is known to be over it."""
    cut = prompt.rfind("\n")
    while cut > 0:
        head = prompt[:cut]
        if _count(tokenizer, head) <= max_tokens:
            return head
        cut = prompt.rfind("\n", 0, cut)
    return None


def apply_length_budget(df: pd.DataFrame, tokens: Tokenized, kind: str, tokenizer,
                        cfg: ValidationConfig, cut_prompts: bool = True):
    """-> (kept rows indexed by their position in ``df``, their tokens, BudgetCounts). Long
    prompts are cut at paragraphs unless not ``cut_prompts`` (a rendered conversation would lose
    its assistant header: dropped); long responses (+1: EOS) dropped or truncated."""
    n_in = len(df)
    is_text = df["prompt"].map(lambda v: isinstance(v, str)).to_numpy(dtype=bool)
    long = np.flatnonzero(is_text & (tokens.lengths("prompt") > cfg.max_prompt_tokens))
    keep = np.ones(n_in, dtype=bool)
    prompts = df["prompt"].tolist()
    cut_rows, heads = [], []
    for i in long:
        head = cut_at_paragraph(prompts[i], tokenizer, cfg.max_prompt_tokens) \
            if cut_prompts else None
        if head is None:
            keep[i] = False
        else:
            cut_rows.append(i)
            heads.append(head)
            prompts[i] = head
    truncated = len(cut_rows)
    df = df.assign(prompt=prompts)
    tokens = tokens.replace("prompt", np.array(cut_rows, dtype=np.int64), heads, tokenizer)
    for col in TEXT_FIELDS[kind]:
        over = tokens.lengths(col) + 1 > cfg.max_response_tokens
        if cfg.long_response_policy == "drop":
            keep &= ~over
            continue
        rows = np.flatnonzero(over)
        ids = tokens.table.column(f"{col}_ids").take(rows).to_pylist()
        texts = [tokenizer.decode(row[: cfg.max_response_tokens - 1]) for row in ids]
        values = df[col].tolist()
        for i, text in zip(rows, texts):
            values[i] = text
        df = df.assign(**{col: values})
        tokens = tokens.replace(col, rows, texts, tokenizer)
        truncated += len(rows)
    kept_rows = np.flatnonzero(keep)
    kept = df.iloc[kept_rows].set_axis(kept_rows)  # each row's position in ``df``
    return kept, tokens.take(kept_rows), BudgetCounts(n_in, truncated, n_in - len(kept))
