"""PPO-for-LM token-level equations (log-probs, entropy, EOS handling, KL, per-token rewards)
against naive per-row / per-token Python references."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.ppo.ppo_math import (
    apply_eos_penalty,
    entropy_from_log_softmax,
    first_true_index,
    kl_estimate,
    last_token_index,
    log_softmax_at,
    logprobs_from_logits,
    per_token_rewards,
    truncate_after_eos,
)
from tests.rlhf_core.ppo_refs import (
    DTYPES,
    EOS,
    PAD,
    SEEDS,
    approx_rows,
    log_softmax_list,
    mask_from_lengths,
    random_lengths,
    tolerance,
)

# ----------------------------------------------------------------------------- log-probs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.5])
@pytest.mark.parametrize("seed", SEEDS)
def test_logprobs_match_naive_temperature_scaled_log_softmax(dtype, temperature, seed):
    g = torch.Generator().manual_seed(seed)
    B, T, V = 2, 4, 7
    logits = (torch.randn(B, T, V, generator=g) * 4).to(dtype)
    tokens = torch.randint(0, V, (B, T), generator=g)
    got = logprobs_from_logits(logits, tokens, temperature)
    assert got.shape == (B, T)
    scale = temperature + 1e-7
    expected = [[log_softmax_list([x / scale for x in logits[b, t].tolist()])[tokens[b, t]]
                 for t in range(T)] for b in range(B)]
    approx_rows(got, expected, rel=1e-5, abs=1e-5)
    ref = torch.log_softmax(logits.double() / scale, -1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_logprobs_are_a_distribution_and_temperature_sharpens():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 3, 5, generator=g)
    every = torch.arange(5).expand(1, 3, 5)
    for temp in (0.5, 1.0, 2.0):
        per_token = torch.stack([logprobs_from_logits(logits, every[..., v], temp)
                                 for v in range(5)], -1)
        torch.testing.assert_close(per_token.exp().sum(-1), torch.ones(1, 3))
    best = logits.argmax(-1)
    cold = logprobs_from_logits(logits, best, 0.5)
    warm = logprobs_from_logits(logits, best, 2.0)
    assert torch.all(cold > warm)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_entropy_matches_naive(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(2, 3, 6, generator=g) * 3).to(dtype)
    got = entropy_from_log_softmax(log_softmax_at(logits))
    expected = []
    for b in range(2):
        row = []
        for t in range(3):
            lp = log_softmax_list(logits[b, t].tolist())
            row.append(-sum(math.exp(x) * x for x in lp))
        expected.append(row)
    approx_rows(got, expected, rel=1e-5, abs=1e-5)


def test_entropy_extremes():
    uniform = torch.zeros(1, 2, 8)
    torch.testing.assert_close(entropy_from_log_softmax(log_softmax_at(uniform)),
                               torch.full((1, 2), math.log(8)))
    peaked = torch.tensor([[[100.0, 0.0, 0.0]]])
    assert entropy_from_log_softmax(log_softmax_at(peaked)).item() == pytest.approx(0.0, abs=1e-6)


# ----------------------------------------------------------------------------- EOS handling


def _naive_truncate(row, eos, pad):
    first = next((i for i, x in enumerate(row) if x == eos), None)
    if first is None:
        return list(row), [True] * len(row), False
    return ([x if i <= first else pad for i, x in enumerate(row)],
            [i <= first for i in range(len(row))], True)


@pytest.mark.parametrize("seed", list(range(6)))
@pytest.mark.parametrize("shape", [(1, 1), (4, 6), (8, 3)])
def test_truncate_after_eos_matches_naive(seed, shape):
    g = torch.Generator().manual_seed(seed)
    responses = torch.randint(0, 4, shape, generator=g)  # ids 0..3, EOS = 1 is frequent
    out, mask, has_eos = truncate_after_eos(responses, EOS, PAD)
    assert mask.dtype == torch.bool and has_eos.dtype == torch.bool
    for b, row in enumerate(responses.tolist()):
        exp_out, exp_mask, exp_has = _naive_truncate(row, EOS, PAD)
        assert out[b].tolist() == exp_out
        assert mask[b].tolist() == exp_mask
        assert bool(has_eos[b]) is exp_has


def test_truncate_edge_rows():
    responses = torch.tensor([[EOS, 5, EOS, 6],   # first token EOS -> length 1
                              [5, 6, 7, 8],       # no EOS -> all kept, has_eos False
                              [5, EOS, 6, EOS],   # only the first EOS counts
                              [5, 6, 7, EOS]])    # EOS at the very end
    out, mask, has_eos = truncate_after_eos(responses, EOS, PAD)
    assert out.tolist() == [[EOS, PAD, PAD, PAD], [5, 6, 7, 8], [5, EOS, PAD, PAD],
                            [5, 6, 7, EOS]]
    assert mask.sum(1).tolist() == [1, 4, 2, 4]
    assert mask[1].all()
    assert has_eos.tolist() == [True, False, True, True]
    assert last_token_index(mask).tolist() == [0, 3, 1, 3]


@pytest.mark.parametrize("seed", SEEDS)
def test_first_true_index_matches_naive(seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(6, 5, generator=g) < 0.2
    mask[0] = False
    expected = [next((i for i, x in enumerate(row) if x), 5) for row in mask.tolist()]
    assert first_true_index(mask).tolist() == expected
    assert first_true_index(mask)[0].item() == 5


def test_last_token_index_and_empty_row():
    mask = mask_from_lengths([1, 3, 5], 5)
    assert last_token_index(mask).tolist() == [0, 2, 4]
    with pytest.raises(ValueError):
        last_token_index(mask_from_lengths([2, 0], 4))


# ----------------------------------------------------------------------------- KL


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_kl_estimators_match_naive(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(3, 5, generator=g) * 5).to(dtype)
    ref = (-torch.rand(3, 5, generator=g) * 5).to(dtype)
    k1 = kl_estimate(logp, ref, "k1")
    k3 = kl_estimate(logp, ref, "k3")
    exp_k1 = [[a - b for a, b in zip(ra, rb)] for ra, rb in zip(logp.tolist(), ref.tolist())]
    exp_k3 = [[(math.exp(b - a) - 1) - (b - a) for a, b in zip(ra, rb)]
              for ra, rb in zip(logp.tolist(), ref.tolist())]
    approx_rows(k1, exp_k1, **tolerance(dtype))
    approx_rows(k3, exp_k3, rel=1e-5, abs=1e-6)
    assert k1.dtype == dtype and k3.dtype == dtype
    assert torch.all(k3 >= 0)
    assert torch.all(kl_estimate(logp, logp, "k3") == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_k3_is_half_squared_difference_for_small_differences(dtype):
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(4, 6, generator=g) * 3).to(dtype)
    d = ((torch.rand(4, 6, generator=g) - 0.5) * 2e-2).to(dtype)  # |d| <= 1e-2
    d[d.abs() < 1e-3] = 1e-3
    k3 = kl_estimate(logp, logp - d, "k3")
    expected = d**2 / 2
    torch.testing.assert_close(k3, expected, rtol=1e-2, atol=1e-9)


def test_unknown_kl_estimator_raises():
    with pytest.raises(ValueError):
        kl_estimate(torch.zeros(1, 2), torch.zeros(1, 2), "k2")


# ----------------------------------------------------------------------------- rewards


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kl_coef", [0.0, 0.05, 0.3])
def test_per_token_rewards_match_naive(dtype, seed, kl_coef):
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 6
    lengths = random_lengths(B, T, g)
    mask = mask_from_lengths(lengths, T)
    kl = torch.randn(B, T, generator=g).to(dtype)
    scores = (torch.randn(B, generator=g) + 3).to(dtype)  # nonzero scores
    rewards, non_score = per_token_rewards(scores, kl, mask, kl_coef)
    for b in range(B):
        exp_ns = [-kl_coef * kl[b, t].item() if t < lengths[b] else 0.0 for t in range(T)]
        exp_r = list(exp_ns)
        exp_r[lengths[b] - 1] += scores[b].item()
        assert non_score[b].tolist() == pytest.approx(exp_ns, **tolerance(dtype))
        assert rewards[b].tolist() == pytest.approx(exp_r, **tolerance(dtype))
        bonus = (rewards[b] - non_score[b]).tolist()
        assert [t for t, x in enumerate(bonus) if x != 0] == [lengths[b] - 1]
    assert torch.all(rewards[~mask] == 0) and torch.all(non_score[~mask] == 0)


def test_per_token_rewards_score_is_exact_without_kl():
    mask = mask_from_lengths([1, 3, 4], 4)
    scores = torch.tensor([0.3, -1.7, 2.9])
    rewards, non_score = per_token_rewards(scores, torch.randn(3, 4), mask, 0.0)
    assert rewards.tolist() == [[scores[0].item(), 0, 0, 0], [0, 0, scores[1].item(), 0],
                                [0, 0, 0, scores[2].item()]]
    assert torch.all(non_score == 0)


def test_per_token_rewards_does_not_modify_inputs():
    mask = mask_from_lengths([2, 3], 3)
    kl, scores = torch.ones(2, 3), torch.tensor([1.0, 2.0])
    per_token_rewards(scores, kl, mask, 0.1)
    assert torch.all(kl == 1) and scores.tolist() == [1.0, 2.0]


def test_apply_eos_penalty_replaces_the_score():
    scores = torch.tensor([5.0, 5.0, -2.0, 0.0])
    has_eos = torch.tensor([True, False, False, True])
    out = apply_eos_penalty(scores, has_eos, -1.0)
    assert out.tolist() == [5.0, -1.0, -1.0, 0.0]  # replaced: not 4.0 or -3.0


@pytest.mark.parametrize("temperature", [0.5, 0.7, 2.0])
def test_entropy_at_a_temperature_is_that_of_the_scaled_distribution(temperature):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 6, generator=g) * 3
    got = entropy_from_log_softmax(log_softmax_at(logits, temperature))
    expected = [[-sum(math.exp(x) * x for x in log_softmax_list(
        [v / (temperature + 1e-7) for v in logits[b, t].tolist()])) for t in range(3)]
        for b in range(2)]
    approx_rows(got, expected, rel=1e-5, abs=1e-5)
    assert not torch.allclose(got, entropy_from_log_softmax(log_softmax_at(logits)))
