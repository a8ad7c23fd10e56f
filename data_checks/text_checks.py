"""Checks on the text itself, before any budget: special-token strings written literally
(they would tokenise to EOS or PAD and end or mask a response), control characters, and text
the tokenizer mostly cannot represent."""

from __future__ import annotations

import re

import pandas as pd

from data_checks.config import ValidationConfig
from data_checks.tokens import Tokenized

TEXT_COLUMNS = ("prompt", "response", "chosen", "rejected")
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # C0 controls but \t \n \r, and DEL


def _rows(mask: pd.Series, limit: int = 10) -> str:
    numbers = [i + 1 for i, hit in enumerate(mask) if hit]
    return ", ".join(map(str, numbers[:limit])) + (" ..." if len(numbers) > limit else "")


def _columns(df: pd.DataFrame) -> list[str]:
    return [c for c in TEXT_COLUMNS if c in df.columns]


def special_token_literals(label: str, df: pd.DataFrame, tokenizer,
                           rendered: bool = False) -> list[str]:
    """A failure per (token, column) where the token's string appears in the text (not in
    ``rendered`` prompts, whose template ends earlier turns with that token; the gate checks
    their messages' content before rendering)."""
    failures = []
    specials = {"EOS": tokenizer.eos_token, "PAD": tokenizer.pad_token}
    for role, token in specials.items():
        if not token:
            continue
        for col in _columns(df)[1 if rendered else 0:]:
            hits = df[col].fillna("").astype(str).str.contains(token, regex=False)
            if hits.any():
                failures.append(f"{label}: {int(hits.sum())} rows contain the tokenizer's {role} "
                                f"token {token!r} literally in {col}: rows {_rows(hits)} (it "
                                "would end or mask the text; remove or escape it)")
    return failures


def control_characters(label: str, df: pd.DataFrame) -> str | None:
    hits = pd.Series(False, index=df.index)
    for col in _columns(df):
        hits |= df[col].fillna("").astype(str).str.contains(CONTROL)
    if not hits.any():
        return None
    return (f"{label}: {int(hits.sum())} rows contain control characters (NUL or other "
            f"non-printing characters): rows {_rows(hits)}")


# rows that repeat another in these columns are reported (the GX suite fails repeated pairs)
DUPLICATE_KEYS = {"sft": ("prompt", "response"), "prompts": ("prompt",)}


def duplicate_rows(label: str, df: pd.DataFrame, kind: str) -> str | None:
    """A warning naming the rows that repeat an earlier row's DUPLICATE_KEYS[kind] (rows with
    a null there are left to the suites), else None."""
    columns = list(DUPLICATE_KEYS.get(kind, ()))
    if not columns or not set(columns) <= set(df.columns):
        return None
    repeats = df[columns].notna().all(axis=1) & df.duplicated(subset=columns, keep="first")
    if not repeats.any():
        return None
    return (f"{label}: {int(repeats.sum())} rows repeat another row's {' + '.join(columns)}: "
            f"rows {_rows(repeats)} (kept; each copy weighs in training as one more row)")


def check_text(label: str, df: pd.DataFrame, tokens: Tokenized, tokenizer,
               cfg: ValidationConfig, report, rendered: bool = False) -> None:
    """Add failures and warnings about the raw text of one data set to ``report``
    (``tokens``: its texts tokenized, data_checks/tokens.py; ``rendered``: its prompts are
    rendered conversations)."""
    report.failures += special_token_literals(label, df, tokenizer, rendered)
    control = control_characters(label, df)
    if control:
        (report.failures if cfg.control_characters == "refuse" else report.warnings).append(
            control + (" (validation.control_characters: refuse)"
                       if cfg.control_characters == "refuse" else ""))
    share = tokens.unknown_share()
    if share > cfg.unknown_token_warn_share:
        report.warnings.append(f"{label}: {share:.0%} of the tokens are the tokenizer's unknown "
                               "token: is this the right tokenizer for this text?")
