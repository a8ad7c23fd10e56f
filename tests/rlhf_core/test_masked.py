"""Masked reductions against naive list-based references."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.masked import masked_mean, masked_sum, masked_var, masked_whiten

DTYPES = [torch.float32, torch.float64]
SHAPES = [(1, 1), (3, 5), (4, 9)]
SEEDS = [0, 1, 2]


def _tol(dtype):
    return {"rel": 1e-5, "abs": 1e-5} if dtype == torch.float32 else \
        {"rel": 1e-10, "abs": 1e-10}


def _data(shape, seed, dtype, every_row=False):
    """Random values and a random bool mask with at least one True (per row if every_row)."""
    g = torch.Generator().manual_seed(seed)
    values = (torch.randn(shape, generator=g) * 3 + 1).to(dtype)
    mask = torch.rand(shape, generator=g) < 0.6
    mask[0, 0] = True
    if every_row:
        cols = torch.randint(0, shape[1], (shape[0],), generator=g)
        mask[torch.arange(shape[0]), cols] = True
    return values, mask


def _selected(values, mask):
    """Masked entries as a Python list of floats (row-major)."""
    return [v for vrow, mrow in zip(values.tolist(), mask.tolist())
            for v, m in zip(vrow, mrow) if m]


def _ref_mean(xs):
    return sum(xs) / len(xs)


def _ref_var(xs, unbiased):
    mu = _ref_mean(xs)
    ss = sum((x - mu) ** 2 for x in xs)
    return ss / (len(xs) - 1) if unbiased else ss / len(xs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_sum_and_mean_match_naive(dtype, shape, seed):
    values, mask = _data(shape, seed, dtype)
    xs = _selected(values, mask)
    s, m = masked_sum(values, mask), masked_mean(values, mask)
    assert s.dtype == dtype and m.dtype == dtype and s.dim() == 0
    assert s.item() == pytest.approx(sum(xs), **_tol(dtype))
    assert m.item() == pytest.approx(_ref_mean(xs), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_row_sum_and_mean_match_naive(dtype, shape, seed):
    values, mask = _data(shape, seed, dtype, every_row=True)
    rows = [[v for v, k in zip(vr, mr) if k] for vr, mr in zip(values.tolist(), mask.tolist())]
    s = masked_sum(values, mask, dim=1)
    m = masked_mean(values, mask, dim=1)
    assert s.shape == (shape[0],) and m.shape == (shape[0],)
    assert s.tolist() == pytest.approx([sum(r) for r in rows], **_tol(dtype))
    assert m.tolist() == pytest.approx([_ref_mean(r) for r in rows], **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5), (4, 9)])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("unbiased", [True, False])
def test_var_matches_naive(dtype, shape, seed, unbiased):
    values, mask = _data(shape, seed, dtype)
    mask[-1, -1] = True  # at least two entries
    xs = _selected(values, mask)
    assert len(xs) >= 2
    got = masked_var(values, mask, unbiased=unbiased)
    assert got.item() == pytest.approx(_ref_var(xs, unbiased), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5), (4, 9)])
@pytest.mark.parametrize("seed", SEEDS)
def test_whiten_is_standardised_inside_and_zero_outside(dtype, shape, seed):
    values, mask = _data(shape, seed, dtype)
    mask[-1, -1] = True
    xs = _selected(values, mask)
    mu, sd = _ref_mean(xs), math.sqrt(_ref_var(xs, unbiased=True) + 1e-8)
    out = masked_whiten(values, mask)
    assert out.dtype == dtype
    expected = [[(v - mu) / sd if k else 0.0 for v, k in zip(vr, mr)]
                for vr, mr in zip(values.tolist(), mask.tolist())]
    for got_row, exp_row in zip(out.tolist(), expected):
        assert got_row == pytest.approx(exp_row, rel=1e-4, abs=1e-5)
    assert torch.all(out[~mask] == 0)
    assert masked_mean(out, mask).item() == pytest.approx(0.0, abs=1e-5)
    assert masked_var(out, mask).item() == pytest.approx(1.0, rel=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_whiten_without_mean_shift_adds_the_mean_back(dtype):
    values, mask = _data((4, 9), 3, dtype)
    mask[-1, -1] = True
    xs = _selected(values, mask)
    mu, sd = _ref_mean(xs), math.sqrt(_ref_var(xs, unbiased=True) + 1e-8)
    out = masked_whiten(values, mask, shift_mean=False)
    exp = [(x - mu) / sd + mu for x in xs]
    assert _selected(out, mask) == pytest.approx(exp, rel=1e-4, abs=1e-5)
    assert masked_mean(out, mask).item() == pytest.approx(mu, rel=1e-4, abs=1e-5)
    assert torch.all(out[~mask] == 0)


def test_garbage_outside_the_mask_never_leaks():
    values = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), -float("inf")]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert masked_sum(values, mask).item() == 6.0
    assert masked_mean(values, mask).item() == 2.0
    assert masked_var(values, mask).item() == pytest.approx(1.0)
    out = masked_whiten(values, mask)
    assert torch.isfinite(out).all()
    assert out[~mask].eq(0).all()
    assert out[mask].tolist() == pytest.approx([-1.0, 0.0, 1.0], rel=1e-6)


def test_integer_mask_behaves_like_bool_mask():
    values, mask = _data((3, 5), 7, torch.float64, every_row=True)
    for m in (mask.long(), mask.float()):
        torch.testing.assert_close(masked_mean(values, m), masked_mean(values, mask))
        torch.testing.assert_close(masked_sum(values, m, dim=1), masked_sum(values, mask, dim=1))
        torch.testing.assert_close(masked_whiten(values, m), masked_whiten(values, mask))


@pytest.mark.parametrize("fn", [masked_sum, masked_mean, masked_var, masked_whiten])
def test_empty_mask_raises(fn):
    values = torch.randn(2, 3)
    with pytest.raises(ValueError):
        fn(values, torch.zeros(2, 3, dtype=torch.bool))


@pytest.mark.parametrize("fn", [masked_sum, masked_mean])
def test_one_empty_row_raises_with_dim(fn):
    values = torch.randn(2, 3)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    fn(values, mask)  # the scalar reduction is fine
    with pytest.raises(ValueError):
        fn(values, mask, dim=1)


def test_single_entry_variance_and_whitening():
    values = torch.tensor([[5.0, 7.0]])
    mask = torch.tensor([[True, False]])
    with pytest.raises(ValueError):
        masked_var(values, mask, unbiased=True)
    assert masked_var(values, mask, unbiased=False).item() == 0.0
    out = masked_whiten(values, mask)
    assert out.tolist() == [[0.0, 0.0]]
    assert masked_whiten(values, mask, shift_mean=False).tolist() == [[5.0, 0.0]]
