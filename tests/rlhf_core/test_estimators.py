"""Critic-free estimators against naive per-sample loops, and their edge cases."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from rlhf_core.ppo.algorithms import (
    RunningMeanBaseline,
    broadcast_to_tokens,
    group_view,
    grpo_advantages,
    kl_loss,
    rloo_advantages,
    sequence_rewards,
)

DTYPES = [torch.float32, torch.float64]


def naive_rloo(rewards: list[float], k: int) -> list[float]:
    out = []
    for i, r in enumerate(rewards):
        g = i // k
        others = [rewards[j] for j in range(g * k, g * k + k) if j != i]
        out.append(r - sum(others) / len(others))
    return out


def naive_grpo(rewards: list[float], k: int, eps: float = 1e-4) -> list[float]:
    out = []
    for i, r in enumerate(rewards):
        group = rewards[(i // k) * k: (i // k) * k + k]
        out.append((r - statistics.fmean(group)) / (statistics.stdev(group) + eps))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_rloo_matches_naive(dtype, k, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(5 * k, generator=g, dtype=dtype)
    got = rloo_advantages(rewards, k)
    assert got.dtype == dtype
    assert got.tolist() == pytest.approx(naive_rloo(rewards.tolist(), k), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_matches_naive(dtype, k, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(5 * k, generator=g, dtype=dtype)
    got = grpo_advantages(rewards, k)
    assert got.tolist() == pytest.approx(naive_grpo(rewards.tolist(), k), rel=1e-5, abs=1e-6)


def test_rloo_advantages_sum_to_zero_per_group():
    rewards = torch.tensor([1.0, 2.0, 6.0, -1.0, -1.0, 5.0])
    adv = rloo_advantages(rewards, 3).view(2, 3)
    assert adv.sum(dim=1).tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    # leave-one-out: sample 0 of group 0 is compared with the mean of 2 and 6
    assert float(adv[0, 0]) == pytest.approx(1.0 - 4.0)


@pytest.mark.parametrize("fn", [rloo_advantages, grpo_advantages])
def test_all_equal_group_has_zero_advantage(fn):
    rewards = torch.tensor([0.5, 0.5, 0.5, 0.5, 1.0, 3.0, 2.0, 0.0])
    adv = fn(rewards, 4)
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert torch.isfinite(adv).all() and adv[4:].abs().sum() > 0


@pytest.mark.parametrize("fn", [rloo_advantages, grpo_advantages])
def test_k1_is_refused_with_the_setting_named(fn):
    with pytest.raises(ValueError, match="samples_per_prompt must be >= 2"):
        fn(torch.tensor([1.0, 2.0]), 1)


def test_group_view_rejects_ragged_batches_and_bad_k():
    with pytest.raises(ValueError, match="groups of 3"):
        group_view(torch.zeros(7), 3)
    with pytest.raises(ValueError, match=">= 1"):
        group_view(torch.zeros(4), 0)
    assert group_view(torch.arange(6.0), 2).tolist() == [[0, 1], [2, 3], [4, 5]]


def test_sequence_rewards_sum_kl_over_real_tokens_only():
    scores = torch.tensor([1.0, -1.0, 0.5])
    kl = torch.tensor([[0.1, 0.2, 9.0], [0.3, 0.3, 0.3], [0.7, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)  # length 1 row
    got = sequence_rewards(scores, kl, mask, kl_coef=0.5)
    expected = [1.0 - 0.5 * 0.3, -1.0 - 0.5 * 0.9, 0.5 - 0.5 * 0.7]
    assert got.tolist() == pytest.approx(expected)


def test_sequence_rewards_refuses_an_empty_response():
    mask = torch.tensor([[True, False], [False, False]])
    with pytest.raises(ValueError, match="empty mask"):
        sequence_rewards(torch.zeros(2), torch.zeros(2, 2), mask, 0.1)


def test_running_mean_baseline_naive_and_state_roundtrip():
    batches = [torch.tensor([1.0, 3.0]), torch.tensor([0.0, 2.0]), torch.tensor([5.0, 5.0])]
    b, base, momentum = RunningMeanBaseline(0.5), None, 0.5
    for rewards in batches:
        mean = sum(rewards.tolist()) / 2
        ref = mean if base is None else base
        assert b.advantages(rewards).tolist() == pytest.approx([r - ref for r in rewards.tolist()])
        base = mean if base is None else momentum * base + (1 - momentum) * mean
        assert b.value == pytest.approx(base)
    clone = RunningMeanBaseline(0.9)
    clone.load_state_dict(b.state_dict())
    nxt = torch.tensor([4.0, 0.0])
    assert clone.advantages(nxt).tolist() == b.advantages(nxt).tolist()
    with pytest.raises(ValueError, match="momentum"):
        RunningMeanBaseline(1.0)


def test_broadcast_to_tokens_zero_outside_mask():
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert broadcast_to_tokens(adv, mask).tolist() == [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]


def test_kl_loss_k3_matches_naive_and_is_zero_at_ref():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -9.0, -9.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    terms = [math.exp(r - p) - (r - p) - 1 for p, r, m in
             zip(logp.flatten().tolist(), ref.flatten().tolist(), mask.flatten().tolist()) if m]
    loss, stats = kl_loss(logp, ref, mask)
    assert float(loss) == pytest.approx(sum(terms) / len(terms), rel=1e-6)
    assert float(stats["kl_loss"]) == pytest.approx(float(loss))
    zero, _ = kl_loss(logp, logp, mask)
    assert float(zero) == 0.0


def test_kl_loss_gradient_is_finite_with_huge_logprobs_off_the_mask():
    logp = torch.tensor([[-1.0, -1e9], [-0.5, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.2, 0.0], [-0.4, -2.5]])
    mask = torch.tensor([[1, 0], [1, 1]], dtype=torch.bool)
    loss, _ = kl_loss(logp, ref, mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert float(logp.grad[0, 1]) == 0.0
