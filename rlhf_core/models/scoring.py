"""A reward model's score read at the EOS of prompt + completion + EOS, normalised with the
``{mean, std, n}`` artifact of scoring the SFT set.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlhf_core.memory import HeapTrimmer
from rlhf_core.models.data import encode, last_real_index, right_pad
from rlhf_core.models.models import ScalarHeadModel


def gather_at(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values [B, T], index [B] -> [B]: values[b, index[b]] (the reward at EOS)."""
    return values.gather(1, index.unsqueeze(1)).squeeze(1)


def score_padded(model: ScalarHeadModel, ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Right-padded [B, T] sequences ending in EOS -> [B] reward read at the EOS token."""
    return gather_at(model(ids, ids != pad_id), last_real_index(ids, pad_id))


@torch.inference_mode()
def score_texts(model: ScalarHeadModel, tokenizer, prompts: Sequence[str],
                responses: Sequence[str], device: torch.device,
                batch_size: int = 64) -> torch.Tensor:
    """RM score of prompt + response + EOS for each pair -> [N] float32 on CPU."""
    eos = [tokenizer.eos_token_id]
    seqs = [encode(tokenizer, p) + encode(tokenizer, r) + eos for p, r in zip(prompts, responses)]
    return score_ids(model, seqs, tokenizer.pad_token_id, device, batch_size)


@torch.inference_mode()
def score_ids(model: ScalarHeadModel, seqs: Sequence[Sequence[int]], pad_id: int,
              device: torch.device, batch_size: int = 64) -> torch.Tensor:
    """RM score of each id sequence (prompt + response + EOS) -> [N] float32 on CPU."""
    model.eval()
    out, heap = [], HeapTrimmer()
    for start in range(0, len(seqs), batch_size):
        batch = [seqs[i] for i in range(start, min(start + batch_size, len(seqs)))]
        ids = right_pad(batch, pad_id).to(device)
        out.append(score_padded(model, ids, pad_id).float().cpu())
        heap.tick()
    return torch.cat(out) if out else torch.empty(0)


def reward_norm_stats(scores: torch.Tensor) -> dict[str, float]:
    """{mean, std, n} of RM scores on the SFT set (the normalisation artifact)."""
    if scores.numel() < 2:
        raise ValueError(f"reward_norm_stats needs at least 2 scores, got {scores.numel()}")
    scores = scores.double()
    return {"mean": float(scores.mean()), "std": float(scores.std()), "n": int(scores.numel())}


def normalise_scores(scores: torch.Tensor, stats: dict[str, float],
                     divide_by_std: bool = False) -> torch.Tensor:
    """r - mean, or (r - mean) / std: the pure function PPO applies to every RM score."""
    out = scores - stats["mean"]
    if divide_by_std:
        out = out / max(stats["std"], 1e-8)
    return out


@torch.no_grad()
def normalise_head(head: torch.nn.Linear, stats: dict[str, float],
                   divide_by_std: bool = False) -> None:
    """Shift (and scale) a warm-started critic's head in place onto the normalised returns'
    scale, else it starts as far off as the RM's mean (README § Sources [RM] does the same)."""
    scale = 1.0 / max(stats["std"], 1e-8) if divide_by_std else 1.0
    head.bias.sub_(stats["mean"]).mul_(scale)
    head.weight.mul_(scale)
