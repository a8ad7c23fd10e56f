"""Reward-model training (the reward_model stage): the score at the EOS token of prompt +
completion + EOS, loss -log sigmoid(r_chosen - r_rejected) (README § Sources [RM]).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from rlhf_core.config import RewardConfig
from rlhf_core.memory import HeapTrimmer
from rlhf_core.models.checkpoint import Checkpointer
from rlhf_core.models.data import encode, pair_example, right_pad
from rlhf_core.models.models import ScalarHeadModel
from rlhf_core.models.ragged import RaggedIds
from rlhf_core.models.scoring import score_padded
from rlhf_core.parallel.distributed import DataParallel
from rlhf_core.train.loop import train_steps
from rlhf_core.train.optim import LogFn


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor,
                       margin: torch.Tensor | None = None):
    """-log sigmoid(r_c - r_r - margin), mean over pairs (README § Sources [RM]): chosen,
    rejected [B] rewards, optional margin [B] -> (loss scalar, stats)."""
    if chosen.numel() == 0:
        raise ValueError("bradley_terry_loss: empty batch")
    diff = chosen - rejected  # (B,)
    logits = diff if margin is None else diff - margin
    loss = -F.logsigmoid(logits).mean()
    d = diff.detach()
    stats = {"accuracy": (d > 0).float().mean(), "margin": d.mean(),
             "chosen_reward": chosen.detach().mean(), "rejected_reward": rejected.detach().mean()}
    return loss, stats


class PairExamples(Sequence):
    """(chosen_ids, rejected_ids) of pair i, built when asked from its ids."""

    def __init__(self, prompts: RaggedIds, chosen: RaggedIds, rejected: RaggedIds,
                 eos_id: int):
        if not len(prompts) == len(chosen) == len(rejected):
            raise ValueError(f"PairExamples: {len(prompts)} prompts, {len(chosen)} chosen, "
                             f"{len(rejected)} rejected")
        self.prompts, self.chosen, self.rejected, self.eos_id = prompts, chosen, rejected, eos_id

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return PairExamples(self.prompts[i], self.chosen[i], self.rejected[i], self.eos_id)
        return pair_example(self.prompts[i], self.chosen[i], self.rejected[i], self.eos_id)


def _pair_scores(model, pairs, idx, pad_id, device, margins=None):
    both = [pairs[i] for i in idx.tolist()]
    chosen = [p[0] for p in both]
    rejected = [p[1] for p in both]
    ids = right_pad(chosen + rejected, pad_id).to(device)  # [2B, T]: one forward for both
    scores = score_padded(model, ids, pad_id)
    n = len(chosen)
    margin = None if margins is None else margins[idx].to(device)
    return scores[:n], scores[n:], margin


def encode_pairs(tokenizer, rows: Sequence[dict]) -> PairExamples:
    """Preference rows -> their pairs, one tokenizer call per text."""
    ids = [RaggedIds.from_lists([encode(tokenizer, r[c]) for r in rows])
           for c in ("prompt", "chosen", "rejected")]
    return PairExamples(*ids, tokenizer.eos_token_id)


def pair_margins(rows: Sequence[dict], use_margin: bool) -> torch.Tensor | None:
    """[N] the rows' margins with ``reward.use_margin``, else None."""
    if not use_margin:
        return None
    if any("margin" not in r for r in rows):
        raise ValueError("reward.use_margin is set but some preference rows have no 'margin'")
    return torch.tensor([float(r["margin"]) for r in rows])


def train_reward_model(
    model: ScalarHeadModel, pairs: PairExamples, margins: torch.Tensor | None, pad_id: int,
    cfg: RewardConfig, device: torch.device, generator: torch.Generator, *,
    on_log: LogFn | None = None, progress: bool = True,
    checkpointer: Checkpointer | None = None, precision: str = "fp32",
    dp: DataParallel | None = None,
) -> dict[str, float]:
    """Train ``model`` in place on ``pairs`` (``margins`` [N] with ``cfg.use_margin``)."""
    if cfg.use_margin and (margins is None or len(margins) != len(pairs)):
        raise ValueError("reward.use_margin is set but the pairs have no margins")
    margins = margins if cfg.use_margin else None

    def loss_fn(net: torch.nn.Module, idx: torch.Tensor):
        rc, rr, margin = _pair_scores(net, pairs, idx, pad_id, device, margins)
        loss, stats = bradley_terry_loss(rc, rr, margin)
        return loss, {f"train/{k}": float(v) for k, v in stats.items()}

    return train_steps(model, loss_fn, len(pairs), cfg, generator, name="reward_model",
                       device=device, on_log=on_log, checkpointer=checkpointer,
                       progress=progress, precision=precision, dp=dp)


@torch.inference_mode()
def evaluate_reward_model(model: ScalarHeadModel, pairs: PairExamples, pad_id: int,
                          device: torch.device, batch_size: int = 64) -> dict[str, float]:
    """Held-out accuracy, loss and mean margin on ``pairs``."""
    model.eval()
    chosen, rejected, heap = [], [], HeapTrimmer()
    for start in range(0, len(pairs), batch_size):
        idx = torch.arange(start, min(start + batch_size, len(pairs)))
        rc, rr, _ = _pair_scores(model, pairs, idx, pad_id, device)
        chosen.append(rc.float().cpu())
        rejected.append(rr.float().cpu())
        heap.tick()
    model.train()
    loss, stats = bradley_terry_loss(torch.cat(chosen), torch.cat(rejected))
    return {"eval/loss": float(loss), **{f"eval/{k}": float(v) for k, v in stats.items()}}
