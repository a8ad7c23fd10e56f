"""Compute precision: autocast over fp32 master weights, gradients and optimizer state; ``auto``
is bf16 on CUDA and on a CPU with native bf16 units for a pretrained model, else fp32.
"""

from __future__ import annotations

import contextlib

import torch

from rlhf_core.hardware import cpu_bf16_units

COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def choose_precision(precision: str, device: torch.device | str,
                     pretrained: bool = False) -> tuple[str, str]:
    """(compute precision, why) for ``model.precision`` on ``device``; fp16 on CPU is refused."""
    kind = torch.device(device).type
    if precision == "auto":
        if kind == "cuda":
            return "bf16", "auto: CUDA"
        units = cpu_bf16_units()
        if units == "none":
            return "fp32", "auto: this CPU has no native bf16 units"
        if not pretrained:
            return "fp32", f"auto: a tiny model trained from scratch (the CPU's {units} unused)"
        return "bf16", f"auto: the CPU has {units} units"
    if precision not in COMPUTE_DTYPES:
        raise ValueError(f"model.precision: unknown {precision!r} (auto, fp32, bf16, fp16)")
    if precision == "fp16" and kind != "cuda":
        raise ValueError("model.precision: fp16 needs CUDA (use bf16 or fp32 on CPU)")
    return precision, "model.precision"


def autocast(precision: str, device: torch.device | str):
    """A context: torch.autocast in the compute dtype, or nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=COMPUTE_DTYPES[precision])
