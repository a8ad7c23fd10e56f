"""On-policy collection, the pure part: k responses per prompt -> pairs to label ((1, 2), (3, 4)
...: samples at one temperature are exchangeable), known-answer pairs mixed in, a pool's order.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence

Judge = Callable[[str, str, bool], float]
Prompt = str | list[dict]  # plain text, or a conversation's messages


def prompt_key(prompt: Prompt) -> str:
    """A prompt as one string (itself, or its messages as JSON), for sets and digests."""
    if isinstance(prompt, str):
        return prompt
    return json.dumps([dict(m) for m in prompt], ensure_ascii=False, sort_keys=True)


def prompt_text(prompt: Prompt) -> str:
    """A prompt's words for a gold judge: itself, or its messages' contents, one per line."""
    return prompt if isinstance(prompt, str) else "\n".join(str(m["content"]) for m in prompt)


def pool_order(prompts: Sequence[Prompt], seed: int = 0) -> list[Prompt]:
    """Distinct prompts of a pool in a fixed shuffled order."""
    distinct = list({prompt_key(p): p for p in prompts if prompt_text(p).strip()}.values())
    random.Random(seed).shuffle(distinct)
    return distinct


def fresh_prompts(pool: Sequence[Prompt], used: set[str], n: int) -> list[Prompt]:
    """The first ``n`` prompts of ``pool`` whose key is not in ``used``."""
    return [p for p in pool if prompt_key(p) not in used][:n]


def pair_up(prompts: Sequence[Prompt], responses: Sequence[Sequence[str]],
            fits: Sequence[Sequence[bool]] | None = None) -> tuple[list[dict], dict[str, int]]:
    """Each prompt's responses [k] -> (pairs, counts), dropping empty, over-budget (``fits``
    [n][k] False), identical and repeated pairs."""
    counts = dict.fromkeys(("candidates", "empty", "over_budget", "identical", "repeated",
                            "kept"), 0)
    pairs, seen = [], set()
    for n, (prompt, answers) in enumerate(zip(prompts, responses, strict=True)):
        key = prompt_key(prompt)
        for i in range(0, len(answers) - 1, 2):
            a, b = answers[i], answers[i + 1]
            counts["candidates"] += 1
            if not a.strip() or not b.strip():
                counts["empty"] += 1
            elif fits is not None and not (fits[n][i] and fits[n][i + 1]):
                counts["over_budget"] += 1
            elif a.strip() == b.strip():
                counts["identical"] += 1
            elif (key, frozenset((a.strip(), b.strip()))) in seen:
                counts["repeated"] += 1
            else:
                seen.add((key, frozenset((a.strip(), b.strip()))))
                pairs.append({"prompt": prompt, "response_a": a, "response_b": b,
                              "index_a": i, "index_b": i + 1})
    counts["kept"] = len(pairs)
    return pairs, counts


def judged_known(pairs: Sequence[dict], judge: Judge, n: int, min_gap: float,
                 seed: int = 0) -> dict[int, str]:
    """Up to ``n`` random pairs the judge scores ``min_gap`` apart -> {pair index: 'a' | 'b'}."""
    clear = {}
    for i, p in enumerate(pairs):
        text = prompt_text(p["prompt"])
        gap = judge(text, p["response_a"], True) - judge(text, p["response_b"], True)
        if abs(gap) >= min_gap:
            clear[i] = "a" if gap > 0 else "b"
    picked = random.Random(seed).sample(sorted(clear), min(n, len(clear)))
    return {i: clear[i] for i in sorted(picked)}


def gold_known(gold: Sequence[dict], n: int, seed: int = 0) -> tuple[list[dict], list[str]]:
    """Up to ``n`` gold rows as pairs, the chosen answer on a random side -> (pairs, answers)."""
    rng = random.Random(seed)
    rows = rng.sample(list(gold), min(n, len(gold)))
    pairs, answers = [], []
    for r in rows:
        first = rng.random() < 0.5
        a, b = (r["chosen"], r["rejected"]) if first else (r["rejected"], r["chosen"])
        pairs.append({"prompt": r["prompt"], "response_a": a, "response_b": b})
        answers.append("a" if first else "b")
    return pairs, answers


def judge_choices(rows: Sequence[dict], score: Judge,
                  choose: Callable[[str, str, str, random.Random], str], seed: int,
                  degraded: bool = False) -> list[str]:
    """A gold judge labelling pairs by ``choose``'s draw; ``degraded``: the side ``score`` puts
    lower ('tie' when equal)."""
    rng, out = random.Random(seed), []
    for r in rows:
        p, a, b = prompt_text(r["prompt"]), r["response_a"], r["response_b"]
        if not degraded:
            out.append(choose(p, a, b, rng))
            continue
        gap = score(p, a, True) - score(p, b, True)
        out.append("tie" if gap == 0 else "b" if gap > 0 else "a")
    return out


def shuffled_with_known(pairs: list[dict], known: list[dict], seed: int = 0) -> list[dict]:
    """The collected pairs with the known-answer ones placed among them at random."""
    rows = [*pairs, *known]
    random.Random(seed + 1).shuffle(rows)
    return rows
