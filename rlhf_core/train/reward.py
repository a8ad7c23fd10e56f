"""Stages 3-4: reward-model training and reward normalisation.

The reward is read at the EOS token (the last real token) of prompt + completion + EOS;
loss -log sigmoid(r_chosen - r_rejected) (README § Sources [RM]). Normalisation statistics are
an explicit artifact ``{mean, std, n}`` from scoring the SFT set, applied by a pure function.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlhf_core.config import RewardConfig
from rlhf_core.models.checkpoint import Checkpointer
from rlhf_core.models.data import encode_pair, right_pad
from rlhf_core.models.models import ScalarHeadModel
from rlhf_core.models.scoring import score_padded
from rlhf_core.parallel.distributed import DataParallel
from rlhf_core.train.loop import train_steps
from rlhf_core.train.losses import bradley_terry_loss
from rlhf_core.train.optim import LogFn


def _pair_scores(model, pairs, idx, pad_id, device, margins=None):
    chosen = [pairs[i][0] for i in idx]
    rejected = [pairs[i][1] for i in idx]
    ids = right_pad(chosen + rejected, pad_id).to(device)  # [2B, T]: one forward for both
    scores = score_padded(model, ids, pad_id)
    n = len(chosen)
    margin = None if margins is None else margins[idx].to(device)
    return scores[:n], scores[n:], margin


def encode_pairs(tokenizer, rows: Sequence[dict]) -> list[tuple[list[int], list[int]]]:
    return [encode_pair(tokenizer, r["prompt"], r["chosen"], r["rejected"]) for r in rows]


def train_reward_model(
    model: ScalarHeadModel, tokenizer, rows: Sequence[dict], cfg: RewardConfig,
    device: torch.device, generator: torch.Generator, *, on_log: LogFn | None = None,
    progress: bool = True, checkpointer: Checkpointer | None = None, precision: str = "fp32",
    dp: DataParallel | None = None,
) -> dict[str, float]:
    """Train ``model`` in place on preference rows {prompt, chosen, rejected[, margin]};
    ``dp``: this rank trains on its shard of each global batch of pairs (DDP)."""
    pairs = encode_pairs(tokenizer, rows)
    if cfg.use_margin and any("margin" not in r for r in rows):
        raise ValueError("reward.use_margin is set but some preference rows have no 'margin'")
    margins = torch.tensor([float(r["margin"]) for r in rows]) if cfg.use_margin else None
    model.to(device)
    net = dp.wrap(model) if dp is not None else model

    def loss_fn(idx: torch.Tensor):
        rc, rr, margin = _pair_scores(net, pairs, idx, tokenizer.pad_token_id, device,
                                      margins)
        loss, stats = bradley_terry_loss(rc, rr, margin)
        return loss, {f"train/{k}": float(v) for k, v in stats.items()}

    return train_steps(model, loss_fn, len(pairs), cfg.batch_size, cfg.epochs, cfg.optim,
                       generator, name="reward_model", log_every=cfg.log_every, on_log=on_log,
                       checkpointer=checkpointer, progress=progress, precision=precision,
                       device=device, dp=dp, net=net)


@torch.inference_mode()
def evaluate_reward_model(model: ScalarHeadModel, tokenizer, rows: Sequence[dict],
                          device: torch.device, batch_size: int = 64) -> dict[str, float]:
    """Held-out accuracy, loss and mean margin on preference rows."""
    model.eval()
    pairs = encode_pairs(tokenizer, rows)
    chosen, rejected = [], []
    for start in range(0, len(pairs), batch_size):
        idx = list(range(start, min(start + batch_size, len(pairs))))
        rc, rr, _ = _pair_scores(model, pairs, idx, tokenizer.pad_token_id, device)
        chosen.append(rc.float().cpu())
        rejected.append(rr.float().cpu())
    model.train()
    loss, stats = bradley_terry_loss(torch.cat(chosen), torch.cat(rejected))
    return {"eval/loss": float(loss), **{f"eval/{k}": float(v) for k, v in stats.items()}}
