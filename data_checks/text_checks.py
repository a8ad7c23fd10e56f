"""Checks on the text itself, before any budget: special-token strings written literally
(they would tokenise to EOS or PAD and end or mask a response), control characters, text the
tokenizer mostly cannot represent, and repeated rows (across chunks, by 64-bit row hashes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from data_checks.config import ValidationConfig
from data_checks.suites import e_g, example_rows
from data_checks.tokens import TEXT_COLUMNS, Tokenized

CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # C0 controls but \t \n \r, and DEL

# rows that repeat another in these columns are reported (the GX suite fails repeated pairs)
DUPLICATE_KEYS = {"sft": ("prompt", "response"), "prompts": ("prompt",)}


@dataclass
class Hits:
    """Rows of a whole data set that hit one check: how many, the first labels, examples."""

    count: int = 0
    first: list[int] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)
    n_examples: int = 0

    def add(self, mask, labels: np.ndarray, df: pd.DataFrame | None = None) -> None:
        """``mask``: the hits among rows labelled ``labels``; ``df``: those rows."""
        rows = np.flatnonzero(np.asarray(mask, dtype=bool))
        self.count += len(rows)
        if len(self.first) <= 10:
            self.first += np.asarray(labels)[rows[: 11 - len(self.first)]].tolist()
        room = self.n_examples - len(self.examples)
        if df is not None and room > 0 and len(rows):
            self.examples += example_rows(df, df.index[rows[:room]].tolist(), room)

    def rows(self, limit: int = 10) -> str:
        """'1, 4, 9 ...': the first hits' row numbers (the label + 1)."""
        return ", ".join(str(i + 1) for i in self.first[:limit]) + \
            (" ..." if self.count > limit else "")


def row_hashes(df: pd.DataFrame, columns) -> np.ndarray:
    """A uint64 hash of each row's ``columns`` (equal rows, equal hashes)."""
    return pd.util.hash_pandas_object(df[list(columns)], index=False).to_numpy(np.uint64)


def repeats(hashes: np.ndarray, keep_first: bool = True) -> np.ndarray:
    """Mask of the rows whose hash an earlier row has (``keep_first``) or any other row has
    (every copy, as GX's compound-unique expectation counts them)."""
    return pd.Series(hashes).duplicated(keep="first" if keep_first else False).to_numpy()


class TextTally:
    """The text checks and repeated rows of one data set: ``add`` each chunk, then ``report``
    once for the whole set."""

    def __init__(self, label: str, kind: str, tokenizer, cfg: ValidationConfig,
                 rendered: bool = False):
        self.label, self.kind, self.cfg, self.rendered = label, kind, cfg, rendered
        self.specials = [(role, token) for role, token in
                         (("EOS", tokenizer.eos_token), ("PAD", tokenizer.pad_token)) if token]
        self.special_hits: dict[tuple[str, str], Hits] = {}
        self.control = Hits(n_examples=cfg.example_rows)
        self.total = self.unknown = 0
        self.keys = DUPLICATE_KEYS.get(kind, ())
        self.hashes: list[np.ndarray] = []
        self.null_key: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []

    def add(self, df: pd.DataFrame, tokens: Tokenized) -> None:
        """One chunk, indexed by its rows' labels (data_checks/loading.py)."""
        labels = df.index.to_numpy()
        columns = [c for c in TEXT_COLUMNS if c in df.columns]
        texts = {col: df[col].fillna("").astype(str) for col in columns}
        for role, token in self.specials:
            for col in columns[1 if self.rendered else 0:]:
                hits = texts[col].str.contains(token, regex=False).to_numpy(dtype=bool)
                self.special_hits.setdefault(
                    (role, col), Hits(n_examples=self.cfg.example_rows)).add(hits, labels, df)
        control = np.zeros(len(df), dtype=bool)
        for col in columns:
            control |= texts[col].str.contains(CONTROL).to_numpy(dtype=bool)
        self.control.add(control, labels, df)
        self.total += sum(int(tokens.lengths(c).sum()) for c in tokens.columns)
        self.unknown += sum(int(tokens.table.column(f"{c}_unk").to_numpy().sum())
                            for c in tokens.columns)
        if self.keys and set(self.keys) <= set(df.columns):
            self.hashes.append(row_hashes(df, self.keys))
            self.null_key.append(~df[list(self.keys)].notna().all(axis=1).to_numpy(bool))
            self.labels.append(labels)

    def report(self, report) -> None:
        """Add the failures and warnings of the whole set to ``report``."""
        for role, token in self.specials:
            for col in TEXT_COLUMNS:
                hits = self.special_hits.get((role, col))
                if hits and hits.count:
                    report.failures.append(
                        f"{self.label}: {hits.count} rows contain the tokenizer's {role} token "
                        f"{token!r} literally in {col}: rows {hits.rows()} (it would end or "
                        "mask the text; remove or escape it)" + e_g(hits.examples))
        if self.control.count:
            text = (f"{self.label}: {self.control.count} rows contain control characters "
                    f"(NUL or other non-printing characters): rows {self.control.rows()}")
            if self.cfg.control_characters == "refuse":
                report.failures.append(text + " (validation.control_characters: refuse)"
                                       + e_g(self.control.examples))
            else:
                report.warnings.append(text)
        share = self.unknown / self.total if self.total else 0.0
        if share > self.cfg.unknown_token_warn_share:
            report.warnings.append(f"{self.label}: {share:.0%} of the tokens are the tokenizer's "
                                   "unknown token: is this the right tokenizer for this text?")
        if self.hashes:
            hashes = np.concatenate(self.hashes)
            nulls = np.concatenate(self.null_key)
            repeated = Hits()
            repeated.add(repeats(hashes) & ~nulls,  # a null key: left to the suites
                         np.concatenate(self.labels))
            if repeated.count:
                report.warnings.append(
                    f"{self.label}: {repeated.count} rows repeat another row's "
                    f"{' + '.join(self.keys)}: rows {repeated.rows()} (kept; each copy weighs "
                    "in training as one more row)")


class Repeats:
    """Rows repeating another in ``columns`` across chunks (GX's compound-unique check), and
    the first ``n_examples`` repeats as examples."""

    def __init__(self, columns, n_examples: int):
        self.columns, self.n_examples = tuple(columns), n_examples
        self.hashes: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self.seen = np.zeros(0, dtype=np.uint64)
        self.examples: list[str] = []

    def add(self, df: pd.DataFrame) -> None:
        hashes = row_hashes(df, self.columns)
        self.hashes.append(hashes)
        self._labels.append(df.index.to_numpy(dtype=np.int64))
        room = self.n_examples - len(self.examples)
        if room <= 0 or not len(hashes):
            return
        earlier = np.zeros(len(hashes), dtype=bool)
        if len(self.seen):
            at = np.minimum(np.searchsorted(self.seen, hashes), len(self.seen) - 1)
            earlier = self.seen[at] == hashes
        hits = np.flatnonzero(earlier | pd.Series(hashes).duplicated().to_numpy())[:room]
        self.examples += example_rows(df, df.index[hits].tolist(), room)
        if len(self.examples) < self.n_examples:
            self.seen = np.sort(np.concatenate([self.seen, hashes]))

    def labels(self) -> np.ndarray | None:
        """The labels of every row whose hash another row has, in file order; None for one
        chunk or none (GX saw every row at once)."""
        if len(self.hashes) < 2:
            return None
        mask = repeats(np.concatenate(self.hashes), keep_first=False)
        return np.concatenate(self._labels)[mask]
