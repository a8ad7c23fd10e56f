"""Labelled files coming back from labellers: rows checked against the collection they came
from, votes counted by majority, and the figures that say whether the labels can be trusted.

Only ``id``, ``choice`` and ``labeller`` are read back: the pair's texts come from the
collection's own record, so an edited response cannot slip into training. A labeller is held
back (their votes dropped) when they answered too few known-answer pairs to be judged, agree with
the known answers too rarely, or skipped too many rows (``collect.quality``): skipping must not
dodge the known-answer check.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from data_checks.errors import DataError
from data_checks.files import file_format, read_local

if TYPE_CHECKING:  # pandas is loaded by the readers, not by the config's LabelRules
    import pandas as pd

CHOICES = ("a", "b", "tie", "skip")
KAPPA_CHOICES = ("a", "b", "tie")  # skips are no judgement: left out of the kappas
SHOWN_ERRORS = 5


@dataclass(frozen=True)
class LabelRules:
    """The thresholds of ``collect.quality`` that judge a labeller and a batch."""

    min_known_agreement: float
    min_known_labelled: int
    max_skip_rate: float


@dataclass(frozen=True)
class Labeller:
    """One labeller's figures and, when held back, why (None: their votes count)."""

    name: str
    rows: int
    skips: int
    known_labelled: int
    known_agreement: float | None
    held_back: str | None

    @property
    def skip_rate(self) -> float:
        return self.skips / self.rows if self.rows else 0.0


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def known_shortfall(labelled: int, agreement: float | None, rules: LabelRules) -> str | None:
    """Why answers to the known pairs cannot be trusted, with the figures; None: they pass."""
    if labelled < rules.min_known_labelled or agreement is None:
        return (f"not enough known answers: {labelled} known pairs answered a or b, fewer "
                f"than {rules.min_known_labelled}")
    if agreement < rules.min_known_agreement:
        return (f"agreement with the known answers {agreement:.2f} on {labelled} pairs is "
                f"below {rules.min_known_agreement}")
    return None


def judge_labellers(rows: Sequence[dict], known: Mapping[str, str], rules: LabelRules
                    ) -> list[Labeller]:
    """Every labeller of ``rows`` with their figures; ``known``: the known-answer pairs'."""
    by_name: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_name[r["labeller"]].append(r)
    out = []
    for name, mine in sorted(by_name.items()):
        hits = [r["choice"] == known[r["id"]] for r in mine
                if r["id"] in known and r["choice"] in ("a", "b")]
        agreement = _mean(hits)
        skips = sum(r["choice"] == "skip" for r in mine)
        why = known_shortfall(len(hits), agreement, rules)
        if skips / len(mine) > rules.max_skip_rate:
            why = f"skipped {skips} of {len(mine)} rows, more than " \
                f"{rules.max_skip_rate:.0%}" + (f"; {why}" if why else "")
        out.append(Labeller(name, len(mine), skips, len(hits), agreement, why))
    return out


def cohen_kappa(x: Sequence[str], y: Sequence[str]) -> float | None:
    """Cohen's kappa (p_o - p_e) / (1 - p_e) of two labellers' choices on the same items (None:
    no item, or chance agreement is 1)."""
    if not x or len(x) != len(y):
        return None
    n = len(x)
    observed = sum(a == b for a, b in zip(x, y)) / n
    cx, cy = Counter(x), Counter(y)
    expected = sum(cx[c] * cy[c] for c in cx) / n ** 2
    return None if expected == 1 else (observed - expected) / (1 - expected)


def fleiss_kappa(items: Sequence[Mapping[str, int]]) -> float | None:
    """Fleiss' kappa over items each rated by the same number n >= 2 of labellers
    (``items``: per item, choice -> votes). (P_bar - P_e) / (1 - P_e), P_i the agreeing
    rater pairs' share on item i, P_e the sum of squared overall choice shares."""
    if not items:
        return None
    n = sum(items[0].values())
    if n < 2 or any(sum(i.values()) != n for i in items):
        return None
    p_bar = sum((sum(v * v for v in i.values()) - n) / (n * (n - 1)) for i in items) / len(items)
    totals = sum(map(Counter, items), Counter())
    p_e = sum((v / (n * len(items))) ** 2 for v in totals.values())
    return None if p_e == 1 else (p_bar - p_e) / (1 - p_e)


def labeller_kappa(rows: Sequence[dict]) -> float | None:
    """Agreement between labellers beyond chance on the pairs they all answered a, b or tie:
    Cohen's kappa for two labellers, Fleiss' for more (None: one labeller, or no shared pair)."""
    votes: dict[str, dict[str, str]] = defaultdict(dict)
    for r in rows:
        if r["choice"] in KAPPA_CHOICES:
            votes[r["labeller"]][r["id"]] = r["choice"]
    names = sorted(votes)
    if len(names) < 2:
        return None
    shared = sorted(set.intersection(*(set(votes[n]) for n in names)))
    if len(names) == 2:
        return cohen_kappa([votes[names[0]][i] for i in shared],
                           [votes[names[1]][i] for i in shared])
    return fleiss_kappa([Counter(votes[n][i] for n in names) for i in shared])


def read_labelled(path: str | Path) -> pd.DataFrame:
    """A labelled file -> its rows; DataError naming the file."""
    path = Path(path)
    fmt, compression = file_format(path)
    if fmt is None:
        raise DataError(f"{path}: unknown labelled file type (use .jsonl, .json, .csv or "
                        ".parquet)")
    df = read_local(path, fmt, compression)
    missing = [c for c in ("id", "choice") if c not in df.columns]
    if missing:
        raise DataError(f"{path}: no {' or '.join(missing)} column (a labelled file has id, "
                        f"choice ({'/'.join(CHOICES)}) and optionally labeller)")
    return df


def is_labelled(path: str | Path) -> bool:
    """Whether a file in the watch folder is a labelled file rather than a preference batch."""
    try:
        read_labelled(path)
    except DataError:
        return False
    return True


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) \
        else str(value).strip()


def check_rows(df: pd.DataFrame, path: str | Path, known_ids: set[str]) -> list[dict]:
    """Every row -> {row, id, choice, labeller}; bad rows are refused together in one DataError
    naming the file and rows."""
    rows, errors = [], []
    has_labeller = "labeller" in df.columns
    for n, rec in enumerate(df.to_dict("records"), start=1):
        pid, choice = _text(rec.get("id")), _text(rec.get("choice")).lower()
        if pid not in known_ids:
            errors.append(f"row {n}: id '{pid}' is not from a collection")
        elif not choice:
            errors.append(f"row {n}: no choice (expected {', '.join(CHOICES)})")
        elif choice not in CHOICES:
            errors.append(f"row {n}: choice '{choice}' is not one of {', '.join(CHOICES)}")
        labeller = _text(rec.get("labeller")) if has_labeller else ""
        rows.append({"row": n, "id": pid, "choice": choice, "labeller": labeller or "unnamed"})
    if errors:
        more = f" (and {len(errors) - SHOWN_ERRORS} more)" if len(errors) > SHOWN_ERRORS else ""
        raise DataError(f"{path}: {len(errors)} row(s) refused, nothing imported: "
                        f"{'; '.join(errors[:SHOWN_ERRORS])}{more}")
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def majority(rows: Sequence[dict]) -> dict[str, dict]:
    """Votes per pair -> {id: {choice, votes, top}}: the most frequent non-skip choice (an even
    split is 'tie'; all skips, 'skip')."""
    by_id: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        by_id[r["id"]].append(r["choice"])
    out = {}
    for pid, choices in by_id.items():
        counts = Counter(c for c in choices if c != "skip")
        if not counts:
            out[pid] = {"choice": "skip", "votes": 0, "top": 0}
            continue
        (best, top), *rest = counts.most_common()
        tied = bool(rest) and rest[0][1] == top
        out[pid] = {"choice": "tie" if tied else best, "votes": sum(counts.values()),
                    "top": top}
    return out


def agreement_rate(decided: Mapping[str, dict]) -> float | None:
    """The mean share of votes for the top choice over pairs with two or more non-skip votes."""
    return _mean([d["top"] / d["votes"] for d in decided.values() if d["votes"] >= 2])


@dataclass(frozen=True)
class LabelFigures:
    """Label quality of one import: the batch's figures (the kept labellers' votes) and every
    labeller's."""

    known_labelled: int  # known pairs whose majority answer was a or b
    known_agreement: float | None  # ... the share of them that matched the known answer
    rm_pairs: int  # other pairs answered a or b where the policy's RM scored the two apart
    rm_agreement: float | None  # ... the share where the majority chose the RM's higher
    agreement_rate: float | None  # mean top-choice share on pairs with 2+ non-skip votes
    kappa: float | None  # Cohen's (two labellers) / Fleiss' (more) kappa on shared pairs
    skip_rate: float  # skipped rows / rows, every labeller
    labellers: tuple[Labeller, ...]

    @property
    def held_back(self) -> dict[str, str]:
        return {lab.name: lab.held_back for lab in self.labellers if lab.held_back}

    def metrics(self) -> dict[str, float]:
        """``labels/*`` metric values (figures that exist), per labeller too."""
        out = {"known_labelled": self.known_labelled, "known_agreement": self.known_agreement,
               "rm_pairs": self.rm_pairs, "rm_agreement": self.rm_agreement,
               "agreement_rate": self.agreement_rate, "kappa": self.kappa,
               "skip_rate": self.skip_rate, "labellers": len(self.labellers),
               "held_back": len(self.held_back)}
        for lab in self.labellers:
            name = re.sub(r"[^\w\-. :/]", "_", lab.name)  # as MLflow takes it (@ -> _)
            out[f"known_agreement/{name}"] = lab.known_agreement
            out[f"known_labelled/{name}"] = lab.known_labelled
            out[f"skip_rate/{name}"] = lab.skip_rate
        return {f"labels/{k}": float(v) for k, v in out.items() if v is not None}


def label_figures(rows: Sequence[dict], kept: Sequence[dict], decided: Mapping[str, dict],
                  records: Mapping[str, dict], labellers: Sequence[Labeller]) -> LabelFigures:
    """Label quality of the kept votes (against the known answers and the policy's reward
    model) and of every row (agreement rate, kappa, skip rate)."""
    known = known_answers(records)
    batch_known = [decided[p]["choice"] == known[p] for p in decided
                   if p in known and decided[p]["choice"] in ("a", "b")]
    rm_hits = [d["choice"] == ("a" if records[p]["rm_a"] > records[p]["rm_b"] else "b")
               for p, d in decided.items() if p not in known and d["choice"] in ("a", "b")
               and records[p].get("rm_a") != records[p].get("rm_b")]
    return LabelFigures(
        known_labelled=len(batch_known), known_agreement=_mean(batch_known),
        rm_pairs=len(rm_hits), rm_agreement=_mean(rm_hits),
        agreement_rate=agreement_rate(decided), kappa=labeller_kappa(rows),
        skip_rate=sum(r["choice"] == "skip" for r in rows) / len(rows) if rows else 0.0,
        labellers=tuple(labellers))


def known_answers(records: Mapping[str, dict]) -> dict[str, str]:
    """{pair id: 'a' | 'b'} of the known-answer pairs among a collection's records."""
    return {pid: rec["known"] for pid, rec in records.items() if rec.get("known")}


def kept_rows(rows: Sequence[dict], labellers: Sequence[Labeller]) -> list[dict]:
    """The rows of the labellers not held back (their votes are the ones that count)."""
    out = {lab.name for lab in labellers if lab.held_back}
    return [r for r in rows if r["labeller"] not in out]


def preference_rows(decided: Mapping[str, dict], records: Mapping[str, dict]
                    ) -> tuple[list[dict], dict[str, int]]:
    """The decided pairs -> preference rows and counts; ties, skips and the known-answer pairs
    (they never train) are left out."""
    out, counts = [], {"pairs": 0, "ties": 0, "skips": 0, "known": 0}
    for pid in sorted(decided):
        rec, choice = records[pid], decided[pid]["choice"]
        if rec.get("known"):
            counts["known"] += 1
        elif choice in ("tie", "skip"):
            counts["ties" if choice == "tie" else "skips"] += 1
        else:
            a, b = rec["response_a"], rec["response_b"]
            chosen, rejected = (a, b) if choice == "a" else (b, a)
            out.append({"prompt": rec["prompt"], "chosen": chosen, "rejected": rejected})
            counts["pairs"] += 1
    return out, counts


def quality_refusal(figures: LabelFigures, rules: LabelRules, usual_rm: float | None,
                    max_rm_drop: float, usual_skip: float | None = None,
                    max_skip_rise: float = 1.0) -> str | None:
    """Why a batch is quarantined, with its figures; None: it passes. RM agreement and skip rate
    are judged against earlier batches' (``usual_*``): on-policy labels may disagree with the RM
    where the policy exploits it, so only a large fall counts."""
    why = []
    if figures.labellers and len(figures.held_back) == len(figures.labellers):
        why.append("every labeller was held back (" + "; ".join(
            f"{name}: {text}" for name, text in figures.held_back.items()) + ")")
    else:
        short = known_shortfall(figures.known_labelled, figures.known_agreement, rules)
        if short:
            why.append(short)
    r = figures.rm_agreement
    if r is not None and usual_rm is not None and r < usual_rm - max_rm_drop:
        why.append(f"agreement with the policy's reward model {r:.2f} on {figures.rm_pairs} "
                   f"pairs is more than {max_rm_drop} below the usual {usual_rm:.2f}")
    if usual_skip is not None and figures.skip_rate > usual_skip + max_skip_rise:
        why.append(f"skip rate {figures.skip_rate:.2f} is more than {max_skip_rise} above the "
                   f"usual {usual_skip:.2f}")
    return "; ".join(why) or None
