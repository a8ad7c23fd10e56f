"""On-policy collection, the pure part: k sampled responses per prompt -> pairs to label,
known-answer pairs mixed in, and the order of a prompt pool. Plain Python, no I/O.

A prompt's k responses are paired in order, (1, 2), (3, 4), ...: each response is used
once, and samples at one temperature are exchangeable, so which side is ``a`` carries no
signal. A pair is dropped when a side is empty (the policy ended at once), when both sides
are the same text, or when the same two texts were already paired for the same prompt.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

Judge = Callable[[str, str, bool], float]


def pool_order(prompts: Sequence[str], seed: int = 0) -> list[str]:
    """Distinct prompts of a pool in a fixed shuffled order (collections take them in this
    order, skipping the ones collected before)."""
    distinct = list(dict.fromkeys(p for p in prompts if p.strip()))
    random.Random(seed).shuffle(distinct)
    return distinct


def fresh_prompts(pool: Sequence[str], used: set[str], n: int) -> list[str]:
    """The first ``n`` prompts of ``pool`` not in ``used``."""
    return [p for p in pool if p not in used][:n]


def pair_up(prompts: Sequence[str], responses: Sequence[Sequence[str]]
            ) -> tuple[list[dict], dict[str, int]]:
    """Each prompt's responses [k] -> pairs ``{prompt, response_a, response_b, index_a,
    index_b}`` and counts: candidates, empty, identical, repeated, kept."""
    counts = dict.fromkeys(("candidates", "empty", "identical", "repeated", "kept"), 0)
    pairs, seen = [], set()
    for prompt, answers in zip(prompts, responses, strict=True):
        for i in range(0, len(answers) - 1, 2):
            a, b = answers[i], answers[i + 1]
            counts["candidates"] += 1
            if not a.strip() or not b.strip():
                counts["empty"] += 1
            elif a.strip() == b.strip():
                counts["identical"] += 1
            elif (prompt, frozenset((a.strip(), b.strip()))) in seen:
                counts["repeated"] += 1
            else:
                seen.add((prompt, frozenset((a.strip(), b.strip()))))
                pairs.append({"prompt": prompt, "response_a": a, "response_b": b,
                              "index_a": i, "index_b": i + 1})
    counts["kept"] = len(pairs)
    return pairs, counts


def judged_known(pairs: Sequence[dict], judge: Judge, n: int, min_gap: float,
                 seed: int = 0) -> dict[int, str]:
    """Up to ``n`` pairs whose answer the judge knows clearly (scores ``min_gap`` apart)
    -> {pair index: 'a' | 'b'}, chosen at random among those."""
    clear = {}
    for i, p in enumerate(pairs):
        gap = judge(p["prompt"], p["response_a"], True) - judge(p["prompt"], p["response_b"], True)
        if abs(gap) >= min_gap:
            clear[i] = "a" if gap > 0 else "b"
    picked = random.Random(seed).sample(sorted(clear), min(n, len(clear)))
    return {i: clear[i] for i in sorted(picked)}


def gold_known(gold: Sequence[dict], n: int, seed: int = 0) -> tuple[list[dict], list[str]]:
    """Up to ``n`` rows of a gold file (prompt, chosen, rejected) as pairs with a random side
    for the chosen answer -> (pairs, answers 'a' | 'b')."""
    rng = random.Random(seed)
    rows = rng.sample(list(gold), min(n, len(gold)))
    pairs, answers = [], []
    for r in rows:
        first = rng.random() < 0.5
        a, b = (r["chosen"], r["rejected"]) if first else (r["rejected"], r["chosen"])
        pairs.append({"prompt": r["prompt"], "response_a": a, "response_b": b})
        answers.append("a" if first else "b")
    return pairs, answers


def shuffled_with_known(pairs: list[dict], known: list[dict], seed: int = 0) -> list[dict]:
    """The collected pairs with the known-answer ones placed among them at random."""
    rows = [*pairs, *known]
    random.Random(seed + 1).shuffle(rows)
    return rows
