"""data_checks/labels.py: labellers judged on the known-answer pairs with the default
thresholds (collect.quality, collect.known_pairs), measured by simulation (seeded, pure
python): a coin-flipper passes at most 1% of the time, an honest labeller at the demo judge's
noise (88% of known pairs right) fails at most 1%, and a labeller who skips to dodge the check
is held back every time. Kappas against hand-computed examples."""

from __future__ import annotations

import random

import pytest

from data_checks.labels import (
    cohen_kappa,
    fleiss_kappa,
    judge_labellers,
    labeller_kappa,
)
from tasks.config.sections import CollectConfig

DEFAULTS = CollectConfig()
RULES, N_KNOWN = DEFAULTS.quality.rules(), DEFAULTS.known_pairs
TRIALS = 10_000


def _held_back_rate(answer, seed: int) -> float:
    """Share of TRIALS simulated labellers held back; ``answer(truth, rng)``: their choice
    on a known pair whose answer is ``truth``."""
    rng, held = random.Random(seed), 0
    known = {f"k{i}": "a" if i % 2 else "b" for i in range(N_KNOWN)}
    for _ in range(TRIALS):
        rows = [{"id": pid, "choice": answer(truth, rng), "labeller": "x"}
                for pid, truth in known.items()]
        (lab,) = judge_labellers(rows, known, RULES)
        held += lab.held_back is not None
    return held / TRIALS


def _coin(truth, rng):
    return rng.choice("ab")


def _coin_skipping(truth, rng):
    return "skip" if rng.random() < 0.3 else rng.choice("ab")


def _honest(truth, rng):  # the demo judge's Bradley-Terry noise on known pairs: >= 88% right
    return truth if rng.random() < 0.88 else {"a": "b", "b": "a"}[truth]


def _dodger(truth, rng):  # skips 85% of rows, reverses the judge on the rest
    return "skip" if rng.random() < 0.85 else {"a": "b", "b": "a"}[truth]


def test_defaults_are_the_documented_ones():
    assert (N_KNOWN, RULES.min_known_agreement, RULES.min_known_labelled) == (40, 0.75, 25)


def test_coin_flippers_pass_at_most_one_percent_and_honest_labellers_fail_at_most_one():
    coin = 1 - _held_back_rate(_coin, 1)  # exact: P(Bin(40, .5) >= 30) = 0.0011
    coin_skipping = 1 - _held_back_rate(_coin_skipping, 2)  # exact: 0.0036
    honest_fail = _held_back_rate(_honest, 3)  # exact: P(Bin(40, .88) <= 29) = 0.0062
    print(f"coin-flipper passes {coin:.4f}, skipping 30% {coin_skipping:.4f}; honest fails "
          f"{honest_fail:.4f} ({TRIALS} trials each)")
    assert coin <= 0.01 and coin_skipping <= 0.01 and honest_fail <= 0.01


def test_a_labeller_who_skips_to_dodge_the_check_is_held_back_every_time():
    assert _held_back_rate(_dodger, 4) == 1.0
    known = {f"k{i}": "a" for i in range(N_KNOWN)}
    rows = [{"id": f"k{i}", "choice": "b" if i < 3 else "skip", "labeller": "x"}
            for i in range(N_KNOWN)]  # the measured case: 3 known answered, all wrong
    (lab,) = judge_labellers(rows, known, RULES)
    assert lab.held_back.startswith("skipped 37 of 40 rows, more than 50%; not enough known "
                                    "answers: 3 known pairs answered a or b, fewer than 25")


def test_cohen_kappa_by_hand():
    # agree on 7 of 10 (p_o 0.7); x says a 6/10, y 5/10: p_e = .6*.5 + .4*.5 = 0.5
    x = list("aaaaaabbbb")
    y = list("aaaabbabbb")
    assert cohen_kappa(x, y) == pytest.approx(0.4)  # (0.7 - 0.5) / (1 - 0.5)
    assert cohen_kappa(list("ab"), list("ab")) == pytest.approx(1.0)
    assert cohen_kappa(list("aa"), list("aa")) is None  # chance agreement 1: undefined


def test_fleiss_kappa_by_hand_and_labeller_kappa_on_shared_pairs():
    # 3 raters, 4 items: P_i = 1, 1/3, 1, 1/3 -> P_bar 2/3; p(a) = p(b) = 0.5 -> P_e 0.5
    items = [{"a": 3}, {"a": 2, "b": 1}, {"b": 3}, {"a": 1, "b": 2}]
    assert fleiss_kappa(items) == pytest.approx(1 / 3)
    votes = {"ann": "aaba", "bob": "aabb", "cid": "abbb"}
    rows = [{"id": f"p{i}", "choice": c, "labeller": n} for n, cs in votes.items()
            for i, c in enumerate(cs)]
    assert labeller_kappa(rows) == pytest.approx(1 / 3)  # the same four items
    rows.append({"id": "p9", "choice": "a", "labeller": "ann"})  # not shared: left out
    assert labeller_kappa(rows) == pytest.approx(1 / 3)
    two = [r for r in rows if r["labeller"] != "cid"]
    # p_o 3/4; ann says a 3/4, bob 2/4: p_e = .75*.5 + .25*.5 = 0.5 -> kappa 0.5
    assert labeller_kappa(two) == pytest.approx(0.5)
    assert labeller_kappa([r for r in rows if r["labeller"] == "ann"]) is None
