"""Shared pieces of the PPO-math tests: dtypes, tolerances, masks, naive log-softmax."""

from __future__ import annotations

import math

import pytest
import torch

DTYPES = [torch.float32, torch.float64]
SEEDS = [0, 1, 2]
EOS, PAD = 1, 0


def tolerance(dtype):
    return {"rel": 1e-5, "abs": 1e-5} if dtype == torch.float32 else \
        {"rel": 1e-10, "abs": 1e-10}


def mask_from_lengths(lengths, T):
    return torch.tensor([[t < n for t in range(T)] for n in lengths])


def random_lengths(B, T, g):
    """Row lengths that always include a length-1 row and a full row (when B >= 2)."""
    lengths = torch.randint(1, T + 1, (B,), generator=g).tolist()
    lengths[0] = 1
    if B > 1:
        lengths[-1] = T
    return lengths


def log_softmax_list(xs):
    m = max(xs)
    lse = m + math.log(sum(math.exp(x - m) for x in xs))
    return [x - lse for x in xs]


def approx_rows(got, expected, **tol):
    for g_row, e_row in zip(got.tolist(), expected):
        assert g_row == pytest.approx(e_row, **tol)
