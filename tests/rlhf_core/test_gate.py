"""The gate's paired bootstrap against a naive loop and a normal approximation, and each
branch of the decision."""

import math
import random

import pytest
import torch

from rlhf_core.eval.gate import (
    GateRule,
    GateSide,
    gate_decision,
    paired_bootstrap_ci,
    paired_win_rate,
)


def _naive_ci(d, confidence, n_bootstrap, seed):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(d), (n_bootstrap, len(d)), generator=gen).tolist()
    means = sorted(sum(d[i] for i in row) / len(d) for row in idx)
    alpha = (1 - confidence) / 2
    q = torch.quantile(torch.tensor(means, dtype=torch.float64),
                       torch.tensor([alpha, 1 - alpha], dtype=torch.float64))
    return sum(d) / len(d), float(q[0]), float(q[1])


def test_bootstrap_matches_a_naive_loop():
    rng = random.Random(1)
    d = [rng.gauss(0.3, 1.0) for _ in range(50)]
    assert paired_bootstrap_ci(d, 0.9, 300, seed=4) == pytest.approx(_naive_ci(d, 0.9, 300, 4))


def test_bootstrap_interval_near_normal_approximation_for_large_n():
    rng = random.Random(0)
    d = [rng.gauss(0.5, 2.0) for _ in range(800)]
    mean, low, high = paired_bootstrap_ci(d, 0.95, 4000)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    half = 1.96 * sd / math.sqrt(len(d))
    assert low == pytest.approx(mean - half, abs=0.03)
    assert high == pytest.approx(mean + half, abs=0.03)


def test_constant_difference_has_a_point_interval_and_empty_is_an_error():
    assert paired_bootstrap_ci([0.25] * 10) == pytest.approx((0.25, 0.25, 0.25))
    with pytest.raises(ValueError, match="no differences"):
        paired_bootstrap_ci([])


def test_win_rate_counts_wins_and_half_ties_with_the_same_resamples_as_the_mean():
    d = [1.0, -2.0, 0.0, 3.0, 0.5, -0.1, 0.0, 2.0]
    wins = [1.0, 0.0, 0.5, 1.0, 1.0, 0.0, 0.5, 1.0]  # a tie counts half
    assert paired_win_rate(d, 0.9, 300, seed=4) == pytest.approx(_naive_ci(wins, 0.9, 300, 4))
    assert paired_win_rate(d)[0] == pytest.approx(5 / 8)
    assert paired_win_rate([0.2] * 12) == pytest.approx((1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="no differences"):
        paired_win_rate([])


def test_the_decision_reports_the_paired_win_rate_and_its_interval():
    f = gate_decision(*_case(shift=0.5))["figures"]
    assert 0.5 < f["win_rate_low"] <= f["win_rate"] <= f["win_rate_high"] <= 1.0
    champ, chall = _case(shift=0.5)
    won = sum(b > a for a, b in zip(champ.scores, chall.scores)) / len(champ.scores)
    assert f["win_rate"] == pytest.approx(won)


def _case(n=200, shift=1.0, noise=1.0, eos_champ=1.0, eos_chall=1.0, kl=1.0, seed=0):
    rng = random.Random(seed)
    champ = [rng.gauss(0, noise) for _ in range(n)]
    chall = [c + shift + rng.gauss(0, noise) for c in champ]
    return (GateSide(champ, [i < eos_champ * n for i in range(n)]),
            GateSide(chall, [i < eos_chall * n for i in range(n)], [kl] * n))


def test_clear_win_promotes_and_no_win_keeps():
    won = gate_decision(*_case(shift=0.5))
    assert won["promote"] and won["figures"]["ci_low"] > 0
    kept = gate_decision(*_case(shift=0.0))
    assert not kept["promote"] and "no significant win" in kept["reason"]
    assert kept["figures"]["ci_low"] <= 0 <= kept["figures"]["ci_high"]
    assert not gate_decision(*_case(shift=0.5), GateRule(margin=1.0))["promote"]


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"eos_champ": 0.9, "eos_chall": 0.8}, "EOS rate"),
    ({"kl": 30.0}, "KL to reference"),
])
def test_guard_rails_stop_a_winner(kwargs, needle):
    out = gate_decision(*_case(shift=2.0, **kwargs))
    assert not out["promote"] and needle in out["reason"]


def test_eos_drop_within_tolerance_is_allowed_and_nan_is_refused():
    assert gate_decision(*_case(shift=2.0, eos_champ=0.9, eos_chall=0.86))["promote"]
    champ, chall = _case(shift=2.0)
    chall.scores[3] = float("nan")
    out = gate_decision(champ, chall)
    assert not out["promote"] and "non-finite" in out["reason"]


def test_too_few_prompts_is_an_error():
    with pytest.raises(ValueError, match=">= 200"):
        gate_decision(*_case(n=199))
    assert gate_decision(*_case(n=20), GateRule(min_prompts=20))["figures"]["n_prompts"] == 20
