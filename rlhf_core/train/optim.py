"""Optimizer and schedule shared by every stage: AdamW (eps 1e-5) with warm-up then decay."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable

import numpy as np
import torch

from rlhf_core.config import OptimConfig

LogFn = Callable[[int, dict[str, float]], None]


def build_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW + LambdaLR: linear warm-up over warmup_ratio*total_steps, then the decay."""
    trained = [p for p in params if p.requires_grad]
    # torch's fused kernel: one pass over each tensor instead of ~8 ops per parameter
    fused = bool(trained) and all(p.device.type in ("cpu", "cuda") for p in trained)
    optimizer = torch.optim.AdamW(
        trained, lr=cfg.lr, eps=cfg.adam_eps, weight_decay=cfg.weight_decay,
        **({"fused": True} if fused else {}),
    )
    warmup = int(cfg.warmup_ratio * total_steps)
    schedule = cfg.schedule

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if schedule == "constant":
            return 1.0
        progress = min((step - warmup) / max(1, total_steps - warmup), 1.0)
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def check_finite(name: str, value: torch.Tensor, step: int) -> None:
    """Stop with a clear error naming the quantity and the step (no silent NaN training)."""
    if not torch.isfinite(value).all():
        raise FloatingPointError(f"non-finite {name} at step {step}: {value.detach().cpu()}")


def seed_everything(seed: int) -> torch.Generator:
    """Seed torch (and python/numpy) and return a CPU generator for data order."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)
