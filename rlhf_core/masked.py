"""Masked reductions, in one place. An empty mask is an error, never a NaN."""

from __future__ import annotations

import contextlib

import torch

_CHECKED = [True]


@contextlib.contextmanager
def trusted_masks():
    """Skip the empty-mask checks (each a device sync) in hot loops over validated masks."""
    _CHECKED[0] = False
    try:
        yield
    finally:
        _CHECKED[0] = True


def _check(mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    m = mask.to(torch.bool)
    if not _CHECKED[0]:
        return m
    if dim is None and not m.any():
        raise ValueError("masked reduction over an empty mask (no True entry)")
    if dim is not None and not m.any(dim=dim).all():
        raise ValueError(f"masked reduction: a row has an empty mask along dim {dim}")
    return m


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is True: scalar, or reduced along ``dim``."""
    m = _check(mask, dim)
    zeroed = torch.where(m, values, torch.zeros_like(values))
    return zeroed.sum() if dim is None else zeroed.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over masked entries: scalar, or per row along ``dim`` (every row non-empty)."""
    m = _check(mask, dim)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return masked_sum(values, m, dim) / count.to(values.dtype)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over masked entries (scalar); Bessel-corrected like TRL when ``unbiased``."""
    m = _check(mask)
    mean = masked_mean(values, m)
    var = masked_mean((values - mean) ** 2, m)
    if unbiased:
        n = m.sum()
        if n < 2:
            raise ValueError("unbiased masked_var needs at least 2 masked entries")
        var = var * n / (n - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor,
                  shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) over masked entries, mean added back if not shift_mean;
    masked-out positions come back as 0 (README § Sources [N+], advantage whitening)."""
    m = _check(mask)
    mean = masked_mean(values, m)
    var = masked_var(values, m, unbiased=bool(m.sum() > 1))
    out = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros_like(out))
