"""Whose labels can be trusted: each labeller judged on the known-answer pairs and on how often
they skipped, and the labellers' agreement with each other (Cohen's / Fleiss' kappa).

A labeller is held back (their votes dropped, the others' still count) when they answered too
few known pairs to be judged, agree with the known answers too rarely, or skipped too many rows:
skipping must not dodge the known-answer check.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

KAPPA_CHOICES = ("a", "b", "tie")  # skips are no judgement: left out of the kappas


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


def known_shortfall(labelled: int, agreement: float | None, rules: LabelRules) -> str | None:
    """Why answers to the known pairs cannot be trusted (too few to judge, or too often
    wrong), with the figures; None: they pass."""
    if labelled < rules.min_known_labelled or agreement is None:
        return (f"not enough known answers: {labelled} known pairs answered a or b, fewer "
                f"than {rules.min_known_labelled}")
    if agreement < rules.min_known_agreement:
        return (f"agreement with the known answers {agreement:.2f} on {labelled} pairs is "
                f"below {rules.min_known_agreement}")
    return None


def judge_labellers(rows: Sequence[dict], known: Mapping[str, str], rules: LabelRules
                    ) -> list[Labeller]:
    """Every labeller of ``rows`` ({id, choice, labeller}) with their figures; ``known``:
    {pair id: 'a' | 'b'} of the known-answer pairs."""
    by_name: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_name[r["labeller"]].append(r)
    out = []
    for name, mine in sorted(by_name.items()):
        hits = [r["choice"] == known[r["id"]] for r in mine
                if r["id"] in known and r["choice"] in ("a", "b")]
        agreement = sum(hits) / len(hits) if hits else None
        skips = sum(r["choice"] == "skip" for r in mine)
        why = known_shortfall(len(hits), agreement, rules)
        if skips / len(mine) > rules.max_skip_rate:
            why = f"skipped {skips} of {len(mine)} rows, more than " \
                f"{rules.max_skip_rate:.0%}" + (f"; {why}" if why else "")
        out.append(Labeller(name, len(mine), skips, len(hits), agreement, why))
    return out


def cohen_kappa(x: Sequence[str], y: Sequence[str]) -> float | None:
    """Cohen's kappa of two labellers' choices on the same items (None: no item, or chance
    agreement is 1, e.g. both always chose one answer). (p_o - p_e) / (1 - p_e)."""
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
    totals: Counter = Counter()
    for i in items:
        totals.update(i)
    p_e = sum((v / (n * len(items))) ** 2 for v in totals.values())
    return None if p_e == 1 else (p_bar - p_e) / (1 - p_e)


def labeller_kappa(rows: Sequence[dict]) -> float | None:
    """Agreement between labellers beyond chance on the pairs they all answered (a, b or
    tie): Cohen's kappa for two labellers, Fleiss' for three or more (None: one labeller,
    or no pair shared by all)."""
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
