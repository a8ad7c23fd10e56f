"""Compute precision: autocast over fp32 master weights (never bf16 parameters for training).

``fp32`` runs plain float32 (bit-identical to the code before mixed precision existed);
``bf16``/``fp16`` run the forward under ``torch.autocast`` while parameters, gradients and
the optimizer state stay float32; ``fp16`` adds a loss scaler (see
:mod:`rlhf_core.train.train_step`).
``auto`` resolves to bf16 on CUDA and fp32 on CPU. On CUDA, float32 matmuls use TF32.
"""

from __future__ import annotations

import contextlib

import torch

COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """'auto' -> 'bf16' on CUDA, 'fp32' elsewhere; fp16 on CPU is refused (no fast kernels)."""
    kind = torch.device(device).type
    if precision == "auto":
        return "bf16" if kind == "cuda" else "fp32"
    if precision not in COMPUTE_DTYPES:
        raise ValueError(f"model.precision: unknown {precision!r} (auto, fp32, bf16, fp16)")
    if precision == "fp16" and kind != "cuda":
        raise ValueError("model.precision: fp16 needs CUDA (use bf16 or fp32 on CPU)")
    return precision


def autocast(precision: str, device: torch.device | str):
    """A context: torch.autocast in the compute dtype, or nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=COMPUTE_DTYPES[precision])


def enable_tf32(device: torch.device | str) -> None:
    """TF32 for float32 matmuls and convolutions on Ampere and newer (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
