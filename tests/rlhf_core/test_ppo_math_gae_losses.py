"""GAE, clipped PPO losses, diagnostics and KL controllers against naive per-row /
per-token Python references."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.ppo.ppo_math import (
    AdaptiveKLController,
    FixedKLController,
    clipped_policy_loss,
    clipped_value_loss,
    compute_gae,
    explained_variance,
)
from tests.rlhf_core.ppo_refs import (
    DTYPES,
    SEEDS,
    approx_rows,
    mask_from_lengths,
    random_lengths,
    tolerance,
)

# ----------------------------------------------------------------------------- GAE


def _naive_gae(rewards, values, lengths, gamma, lam):
    """Per-row backward loop in Python floats; the episode ends at the last real token."""
    advs, rets = [], []
    for r, v, n in zip(rewards, values, lengths):
        T = len(r)
        adv = [0.0] * T
        last = 0.0
        for t in reversed(range(n)):
            next_v = v[t + 1] if t + 1 < n else 0.0
            delta = r[t] + gamma * next_v - v[t]
            last = delta + gamma * lam * last
            adv[t] = last
        advs.append(adv)
        rets.append([adv[t] + v[t] if t < n else 0.0 for t in range(T)])
    return advs, rets


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (5, 8)])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (0.99, 0.0), (1.0, 1.0)])
def test_gae_matches_naive_loop(dtype, shape, seed, gamma, lam):
    g = torch.Generator().manual_seed(seed)
    B, T = shape
    lengths = random_lengths(B, T, g)
    mask = mask_from_lengths(lengths, T)
    rewards = torch.randn(B, T, generator=g).to(dtype)
    values = torch.randn(B, T, generator=g).to(dtype)
    adv, ret = compute_gae(rewards, values, mask, gamma, lam)
    assert adv.dtype == dtype and ret.dtype == dtype
    exp_adv, exp_ret = _naive_gae(rewards.tolist(), values.tolist(), lengths, gamma, lam)
    approx_rows(adv, exp_adv, **tolerance(dtype))
    approx_rows(ret, exp_ret, **tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gae_gamma_lambda_one_is_reward_to_go_minus_value(dtype):
    g = torch.Generator().manual_seed(4)
    lengths = [1, 4, 6, 3]
    mask = mask_from_lengths(lengths, 6)
    rewards = torch.randn(4, 6, generator=g).to(dtype)
    values = torch.randn(4, 6, generator=g).to(dtype)
    adv, ret = compute_gae(rewards, values, mask, 1.0, 1.0)
    for b, n in enumerate(lengths):
        r, v = rewards[b].tolist(), values[b].tolist()
        exp = [sum(r[t:n]) - v[t] if t < n else 0.0 for t in range(6)]
        assert adv[b].tolist() == pytest.approx(exp, **tolerance(dtype))
        assert ret[b].tolist() == pytest.approx(
            [sum(r[t:n]) if t < n else 0.0 for t in range(6)], **tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gae_ignores_everything_beyond_the_mask(dtype):
    g = torch.Generator().manual_seed(5)
    lengths = [2, 5, 1]
    mask = mask_from_lengths(lengths, 5)
    rewards = torch.randn(3, 5, generator=g).to(dtype)
    values = torch.randn(3, 5, generator=g).to(dtype)
    clean_adv, clean_ret = compute_gae(rewards * mask, values * mask, mask, 0.95, 0.9)
    noisy_r = torch.where(mask, rewards, torch.full_like(rewards, 1e4))
    noisy_v = torch.where(mask, values, torch.full_like(values, -1e4))
    adv, ret = compute_gae(noisy_r, noisy_v, mask, 0.95, 0.9)
    torch.testing.assert_close(adv, clean_adv)
    torch.testing.assert_close(ret, clean_ret)
    assert torch.all(adv[~mask] == 0) and torch.all(ret[~mask] == 0)


def test_gae_single_token_response():
    adv, ret = compute_gae(torch.tensor([[2.0, 9.0]]), torch.tensor([[0.5, 7.0]]),
                           mask_from_lengths([1], 2), 0.9, 0.9)
    assert adv.tolist() == [[1.5, 0.0]]  # r - V, no bootstrap from the padded value
    assert ret.tolist() == [[2.0, 0.0]]


# ----------------------------------------------------------------------------- PPO losses


def _naive_policy_loss(logp, old, adv, mask, eps):
    terms = []
    for lr, orow, arow, mrow in zip(logp, old, adv, mask):
        for a, b, A, m in zip(lr, orow, arow, mrow):
            if m:
                ratio = math.exp(a - b)
                terms.append(max(-A * ratio, -A * min(max(ratio, 1 - eps), 1 + eps)))
    return sum(terms) / len(terms)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("eps", [0.1, 0.2])
def test_clipped_policy_loss_matches_naive(dtype, seed, eps):
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 6
    mask = mask_from_lengths(random_lengths(B, T, g), T)
    old = (-torch.rand(B, T, generator=g) * 3).to(dtype)
    logp = old + (torch.randn(B, T, generator=g) * 0.3).to(dtype)
    adv = torch.randn(B, T, generator=g).to(dtype)
    loss, stats = clipped_policy_loss(logp, old, adv, mask, eps)
    args = (logp.tolist(), old.tolist(), adv.tolist(), mask.tolist())
    assert loss.item() == pytest.approx(_naive_policy_loss(*args, eps), **tolerance(dtype))
    ratios = [math.exp(a - b) for lr, orow, mrow in zip(*args[:2], args[3])
              for a, b, m in zip(lr, orow, mrow) if m]
    advs = [A for arow, mrow in zip(args[2], args[3]) for A, m in zip(arow, mrow) if m]
    clipped = [(-A * min(max(r, 1 - eps), 1 + eps)) > (-A * r) for r, A in zip(ratios, advs)]
    assert stats["clipfrac"].item() == pytest.approx(sum(clipped) / len(clipped), abs=1e-6)
    assert stats["ratio"].item() == pytest.approx(sum(ratios) / len(ratios), **tolerance(dtype))
    kl = 0.5 * sum(math.log(r) ** 2 for r in ratios) / len(ratios)
    assert stats["approxkl"].item() == pytest.approx(kl, rel=1e-4, abs=1e-7)
    mean_r = sum(ratios) / len(ratios)
    var_r = sum((r - mean_r) ** 2 for r in ratios) / len(ratios)
    assert stats["ratio_var"].item() == pytest.approx(var_r, rel=1e-4, abs=1e-7)


def test_policy_loss_is_minus_advantage_when_ratio_is_one():
    adv = torch.tensor([[2.0, -0.5, 3.0]])
    logp = torch.tensor([[-1.0, -2.0, -0.3]])
    loss, stats = clipped_policy_loss(logp, logp.clone(), adv, torch.ones(1, 3, dtype=bool), 0.2)
    assert loss.item() == pytest.approx(-adv.mean().item())
    for t in range(3):
        single = torch.zeros(1, 3, dtype=torch.bool)
        single[0, t] = True
        assert clipped_policy_loss(logp, logp, adv, single, 0.2)[0].item() == \
            pytest.approx(-adv[0, t].item())
    assert stats["clipfrac"].item() == 0.0
    assert stats["ratio"].item() == pytest.approx(1.0)


def test_policy_gradient_is_zero_where_clipped_in_the_advantage_direction():
    eps = 0.2
    old = torch.zeros(1, 7)
    log_ratio = torch.tensor([[math.log(1.5), math.log(0.5), math.log(0.5), math.log(1.5),
                               math.log(1.1), math.log(0.9), math.log(1.5)]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 2.0, -2.0, 5.0]])
    mask = torch.tensor([[True, True, True, True, True, True, False]])
    logp = log_ratio.clone().requires_grad_(True)
    loss, stats = clipped_policy_loss(logp, old, adv, mask, eps)
    loss.backward()
    grad = logp.grad[0].tolist()
    n = 6
    ratio = log_ratio.exp()[0].tolist()
    # 0: A>0, ratio>1+eps and 1: A<0, ratio<1-eps -> clipped objective is flat.
    assert grad[0] == 0.0 and grad[1] == 0.0
    # 2: A>0, ratio<1-eps and 3: A<0, ratio>1+eps -> the unclipped (pessimistic) term rules.
    assert grad[2] == pytest.approx(-1.0 * ratio[2] / n)
    assert grad[3] == pytest.approx(1.0 * ratio[3] / n)
    # 4, 5: inside the trust region -> d(-A r)/dlogp = -A r.
    assert grad[4] == pytest.approx(-2.0 * ratio[4] / n)
    assert grad[5] == pytest.approx(2.0 * ratio[5] / n)
    assert grad[6] == 0.0  # masked out
    assert stats["clipfrac"].item() == pytest.approx(2 / 6)


def _naive_value_loss(v, old, ret, mask, eps):
    terms = []
    for vr, orow, rr, mr in zip(v, old, ret, mask):
        for a, o, r, m in zip(vr, orow, rr, mr):
            if m:
                c = o + min(max(a - o, -eps), eps)
                terms.append(max((a - r) ** 2, (c - r) ** 2))
    return 0.5 * sum(terms) / len(terms)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_clipped_value_loss_matches_naive(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 5
    mask = mask_from_lengths(random_lengths(B, T, g), T)
    old = torch.randn(B, T, generator=g).to(dtype)
    values = old + (torch.randn(B, T, generator=g) * 0.5).to(dtype)
    returns = torch.randn(B, T, generator=g).to(dtype)
    loss, stats = clipped_value_loss(values, old, returns, mask, 0.2)
    args = (values.tolist(), old.tolist(), returns.tolist(), mask.tolist())
    assert loss.item() == pytest.approx(_naive_value_loss(*args, 0.2), **tolerance(dtype))
    assert 0.0 <= stats["clipfrac"].item() <= 1.0
    unclipped = 0.5 * ((values - returns)[mask] ** 2).mean().item()
    assert loss.item() >= unclipped - 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
def test_value_loss_with_identical_values_is_half_mse(dtype):
    g = torch.Generator().manual_seed(1)
    mask = mask_from_lengths([2, 5, 1], 5)
    values = torch.randn(3, 5, generator=g).to(dtype)
    returns = torch.randn(3, 5, generator=g).to(dtype)
    loss, stats = clipped_value_loss(values, values.clone(), returns, mask, 0.2)
    sq = [(a - r) ** 2 for vr, rr, mr in zip(values.tolist(), returns.tolist(), mask.tolist())
          for a, r, m in zip(vr, rr, mr) if m]
    assert loss.item() == pytest.approx(0.5 * sum(sq) / len(sq), **tolerance(dtype))
    assert stats["clipfrac"].item() == 0.0


def test_value_loss_clipping_blocks_gradient_on_overshoot():
    old = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[1.0, 1.0]])
    values = torch.tensor([[2.0, 0.1]], requires_grad=True)  # token 0 moved past eps
    loss, stats = clipped_value_loss(values, old, returns, torch.ones(1, 2, dtype=bool), 0.2)
    loss.backward()
    # token 0: (2-1)^2 = 1 vs (0.2-1)^2 = 0.64 -> unclipped term dominates, gradient flows.
    assert values.grad[0, 0].item() == pytest.approx(0.5 * 2 * (2.0 - 1.0) / 2)
    # token 1: inside the clip range, plain 0.5 MSE gradient.
    assert values.grad[0, 1].item() == pytest.approx(0.5 * 2 * (0.1 - 1.0) / 2)
    assert stats["clipfrac"].item() == 0.0
    values2 = torch.tensor([[1.5, 0.1]], requires_grad=True)  # overshoot away from old
    old2 = torch.tensor([[1.0, 0.0]])
    returns2 = torch.tensor([[1.9, 1.0]])
    loss2, stats2 = clipped_value_loss(values2, old2, returns2, torch.ones(1, 2, dtype=bool), 0.2)
    loss2.backward()
    # token 0: clipped value 1.2 is further from 1.9 than 1.5 -> clipped branch, no gradient.
    assert values2.grad[0, 0].item() == 0.0
    assert stats2["clipfrac"].item() == pytest.approx(0.5)


# ----------------------------------------------------------------------------- diagnostics


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_explained_variance_matches_naive(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    mask = mask_from_lengths([3, 5, 2], 5)
    returns = torch.randn(3, 5, generator=g).to(dtype)
    values = returns + (torch.randn(3, 5, generator=g) * 0.5).to(dtype)
    r = [x for row, m in zip(returns.tolist(), mask.tolist()) for x, k in zip(row, m) if k]
    v = [x for row, m in zip(values.tolist(), mask.tolist()) for x, k in zip(row, m) if k]

    def var(xs):
        mu = sum(xs) / len(xs)
        return sum((x - mu) ** 2 for x in xs) / len(xs)

    expected = 1 - var([a - b for a, b in zip(r, v)]) / var(r)
    assert explained_variance(values, returns, mask).item() == pytest.approx(expected, rel=1e-5)


def test_explained_variance_special_cases():
    mask = torch.ones(2, 3, dtype=torch.bool)
    returns = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 7.0]])
    assert explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.zeros_like(returns), returns, mask).item() == \
        pytest.approx(0.0, abs=1e-6)
    const = torch.full((2, 3), 2.0)
    assert explained_variance(torch.randn(2, 3), const, mask).item() == 0.0


# ----------------------------------------------------------------------------- KL controllers


def test_fixed_kl_controller_never_moves():
    ctl = FixedKLController(0.05)
    for kl in (0.0, 1.0, 100.0):
        ctl.update(kl, 64)
    assert ctl.value == 0.05


@pytest.mark.parametrize("n_steps,horizon", [(64, 10000), (512, 1000), (1, 1)])
def test_adaptive_kl_controller_moves_toward_target_with_clipped_steps(n_steps, horizon):
    target = 6.0
    step = n_steps / horizon
    cases = [(60.0, 1 + 0.2 * step),      # far above target: clipped at +20%
             (0.0, 1 - 0.2 * step),       # far below target: clipped at -20%
             (6.6, 1 + 0.1 * step),       # 10% above: proportional
             (5.7, 1 - 0.05 * step),      # 5% below: proportional
             (6.0, 1.0)]                  # on target: unchanged
    for kl, factor in cases:
        ctl = AdaptiveKLController(0.1, target, horizon)
        ctl.update(kl, n_steps)
        assert ctl.value == pytest.approx(0.1 * factor, rel=1e-12)
        if kl > target:
            assert ctl.value > 0.1
        elif kl < target:
            assert ctl.value < 0.1
