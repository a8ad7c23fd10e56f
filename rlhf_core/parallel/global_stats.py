"""Statistics over the global batch split across data-parallel ranks (whitening over the full
batch, README § Sources [N+]): sums all-reduced in float64, the same on every rank; in one
process each function is the single-process one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlhf_core.masked import masked_var, masked_whiten
from rlhf_core.models.scoring import reward_norm_stats


def world_size() -> int:
    """Ranks in the default group; 1 without torch.distributed."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _all_reduce(values: torch.Tensor, op) -> torch.Tensor:
    out = values.detach().to(torch.float64).clone()
    if world_size() > 1:
        dist.all_reduce(out, op=op)
    return out


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` over the ranks, in float64 (a new tensor)."""
    return _all_reduce(values, dist.ReduceOp.SUM)


def all_reduce_max(values: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum of ``values`` over the ranks, in float64."""
    return _all_reduce(values, dist.ReduceOp.MAX)


def global_masked_moments(values: torch.Tensor, mask: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean, biased variance, count) of the masked entries of every rank's shard ``values``
    (any shape, ``mask`` alike): float64 scalars, equal on every rank; an empty global mask
    raises on every rank."""
    m = mask.to(torch.bool)
    v = values.detach().to(torch.float64)
    zero = torch.zeros_like(v)
    count = all_reduce_sum(m.sum())
    if count == 0:
        raise ValueError("masked reduction over an empty mask (no True entry on any rank)")
    mean = all_reduce_sum(torch.where(m, v, zero).sum()) / count
    sq_dev = all_reduce_sum(torch.where(m, (v - mean) ** 2, zero).sum())
    return mean, sq_dev / count, count


def global_masked_var(values: torch.Tensor, mask: torch.Tensor,
                      unbiased: bool = True) -> torch.Tensor:
    """``masked_var`` over the global batch (scalar in ``values.dtype``)."""
    if world_size() == 1:
        return masked_var(values, mask, unbiased=unbiased)
    _, var, count = global_masked_moments(values, mask)
    if unbiased:
        if count < 2:
            raise ValueError("unbiased masked_var needs at least 2 masked entries")
        var = var * count / (count - 1)
    return var.to(values.dtype)


def global_masked_whiten(values: torch.Tensor, mask: torch.Tensor,
                         shift_mean: bool = True) -> torch.Tensor:
    """``masked_whiten`` of this rank's shard [B, T] with the global batch's mean and variance
    (``mask`` may be empty on this rank; README § Sources [N+])."""
    if world_size() == 1:
        return masked_whiten(values, mask, shift_mean=shift_mean)
    m = mask.to(torch.bool)
    mean, var, count = global_masked_moments(values, m)
    if count > 1:
        var = var * count / (count - 1)  # Bessel, as masked_whiten
    mean, var = mean.to(values.dtype), var.to(values.dtype)
    out = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros_like(out))


def global_reward_norm_stats(scores: torch.Tensor) -> dict[str, float]:
    """``reward_norm_stats`` ({mean, std, n}) of the RM scores of every rank's shard."""
    if world_size() == 1:
        return reward_norm_stats(scores)
    total = all_reduce_sum(torch.tensor(scores.numel(), device=scores.device))
    if total < 2:
        raise ValueError(f"reward_norm_stats needs at least 2 scores, got {int(total)}")
    mean, var, count = global_masked_moments(scores, torch.ones_like(scores, dtype=torch.bool))
    std = torch.sqrt(var * count / (count - 1))
    return {"mean": float(mean), "std": float(std), "n": int(count)}


def global_weighted_means(metrics: dict[str, float], weight: float) -> dict[str, float]:
    """Per-rank metrics -> their mean over ranks weighted by ``weight`` (what each rank's values
    average over: tokens or sequences); every rank must pass the same keys."""
    if world_size() == 1:
        return dict(metrics)
    keys = sorted(metrics)
    every = [None] * world_size()
    dist.all_gather_object(every, keys)
    if any(k != keys for k in every):
        differ = sorted(set().union(*every) - set.intersection(*map(set, every)))
        raise ValueError(f"ranks logged different metrics: {differ}")
    values = torch.tensor([weight] + [weight * float(metrics[k]) for k in keys],
                          dtype=torch.float64)
    total = all_reduce_sum(values)
    if total[0] <= 0:
        raise ValueError(f"global_weighted_means: total weight {float(total[0])} is not > 0")
    return {k: float(v) for k, v in zip(keys, total[1:] / total[0])}
