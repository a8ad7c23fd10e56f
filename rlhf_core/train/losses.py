"""Supervised losses: causal-LM (SFT) and Bradley-Terry (reward model). Return (loss, stats)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor,
                       margin: torch.Tensor | None = None):
    """-log sigmoid(r_c - r_r - margin), mean over pairs (README § Sources [RM]).

    Args: chosen, rejected: [B] rewards; margin: optional [B].
    Returns: (loss scalar, stats)."""
    if chosen.numel() == 0:
        raise ValueError("bradley_terry_loss: empty batch")
    diff = chosen - rejected  # (B,)
    logits = diff if margin is None else diff - margin
    loss = -F.logsigmoid(logits).mean()
    d = diff.detach()
    stats = {"accuracy": (d > 0).float().mean(), "margin": d.mean(),
             "chosen_reward": chosen.detach().mean(), "rejected_reward": rejected.detach().mean()}
    return loss, stats


def sft_loss(logits: torch.Tensor, labels: torch.Tensor):
    """Next-token cross-entropy, mean over supervised tokens (label -100 ignored): logits
    [B, T, V] at t predict labels [B, T] at t+1."""
    shift_logits = logits[:, :-1].reshape(-1, logits.shape[-1])  # (B*(T-1), V)
    shift_labels = labels[:, 1:].reshape(-1)  # (B*(T-1),)
    n = int((shift_labels != IGNORE_INDEX).sum())
    if n == 0:
        raise ValueError("sft_loss: no supervised token in the batch")
    loss = F.cross_entropy(shift_logits.float(), shift_labels, ignore_index=IGNORE_INDEX)
    return loss, {"loss": loss.detach(), "num_tokens": torch.tensor(n)}
