"""Supervised fine-tuning: causal-LM loss on prompt + response + EOS, by default on the
response tokens only (README § Sources [N+]).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from rlhf_core.config import SFTConfig
from rlhf_core.models.checkpoint import Checkpointer
from rlhf_core.models.data import IGNORE_INDEX, encode, right_pad, sft_example
from rlhf_core.models.ragged import RaggedIds
from rlhf_core.models.sampling import takes_logits_to_keep
from rlhf_core.parallel.distributed import DataParallel
from rlhf_core.train.loop import train_steps
from rlhf_core.train.optim import LogFn
from rlhf_core.train.ptx import PretrainMix


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


def supervised_loss(model, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor):
    """:func:`sft_loss` of ``model`` on a right-padded batch, the LM head run only from the
    position before the batch's first supervised label on (``logits_to_keep``): a prompt's
    logits would be computed, then ignored, and their [B, T, V] is most of SFT's memory."""
    supervised = (labels != IGNORE_INDEX).any(0).nonzero()
    first = int(supervised[0]) if len(supervised) else 1
    keep = ids.shape[1] - max(first - 1, 0)
    kwargs = {"logits_to_keep": keep} if keep < ids.shape[1] and takes_logits_to_keep(model) \
        else {}
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False, **kwargs).logits
    return sft_loss(logits, labels[:, ids.shape[1] - logits.shape[1]:])


class SFTExamples(Sequence):
    """(input_ids, labels) of row i, built when asked from its ids."""

    def __init__(self, prompts: RaggedIds, responses: RaggedIds, eos_id: int,
                 loss_on: str = "response"):
        if len(prompts) != len(responses):
            raise ValueError(f"SFTExamples: {len(prompts)} prompts, {len(responses)} responses")
        self.prompts, self.responses, self.eos_id, self.loss_on = \
            prompts, responses, eos_id, loss_on

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return SFTExamples(self.prompts[i], self.responses[i], self.eos_id, self.loss_on)
        return sft_example(self.prompts[i], self.responses[i], self.eos_id, self.loss_on)

    def with_loss_on(self, loss_on: str) -> SFTExamples:
        return SFTExamples(self.prompts, self.responses, self.eos_id, loss_on)

    def supervised_tokens(self) -> torch.Tensor:
        """[N] int64: each example's supervised labels after the shift, what its loss averages."""
        p = torch.from_numpy(self.prompts.lengths())
        r = torch.from_numpy(self.responses.lengths())
        if self.loss_on == "all":
            return p + r  # every label but the first (p + r + 1 of them)
        return r + 1 - (p == 0).long()  # response + EOS, less the first when no prompt


def encode_sft_rows(tokenizer, rows: Sequence[dict], loss_on: str) -> SFTExamples:
    """rows of {prompt, response} -> their (input_ids, labels), one tokenizer call per text."""
    ids = {c: RaggedIds.from_lists([encode(tokenizer, r[c]) for r in rows])
           for c in ("prompt", "response")}
    return SFTExamples(ids["prompt"], ids["response"], tokenizer.eos_token_id, loss_on)


def sft_batch(examples, pad_id: int, device: torch.device):
    """-> input_ids, attention_mask, labels, each [B, T] (T = longest in the batch)."""
    ids = right_pad([e[0] for e in examples], pad_id).to(device)
    labels = right_pad([e[1] for e in examples], IGNORE_INDEX).to(device)
    return ids, ids != pad_id, labels


def train_sft(
    model, examples: SFTExamples, pad_id: int, cfg: SFTConfig, device: torch.device,
    generator: torch.Generator, *, on_log: LogFn | None = None, progress: bool = True,
    checkpointer: Checkpointer | None = None, precision: str = "fp32",
    dp: DataParallel | None = None, pretrain_ids: Sequence[Sequence[int]] | None = None,
) -> dict[str, float]:
    """Fine-tune ``model`` in place on ``examples``; returns the final metrics.
    ``generator`` orders the data; ``pretrain_ids``: the ptx chunks (``cfg.ptx_coef`` > 0)."""
    if examples.loss_on != cfg.loss_on:
        raise ValueError(f"SFT examples built for loss_on={examples.loss_on!r}, "
                         f"sft.loss_on is {cfg.loss_on!r}")
    # supervised (shifted) tokens per example: the loss is a mean over these
    n_tokens = examples.supervised_tokens().numpy()

    mix = PretrainMix(pretrain_ids or [], cfg.ptx_batch_size or cfg.batch_size, pad_id,
                      generator, device) if cfg.ptx_coef > 0 else None

    def loss_fn(net: torch.nn.Module, idx: torch.Tensor):
        ids, mask, labels = sft_batch([examples[i] for i in idx.tolist()], pad_id, device)
        loss, stats = supervised_loss(net, ids, mask, labels)
        extras = {"train/tokens": float(stats["num_tokens"])}
        if mix is not None:
            ptx = mix.loss(net)
            loss, extras["ptx/loss"] = loss + cfg.ptx_coef * ptx, float(ptx)
        return loss, extras

    return train_steps(model, loss_fn, len(examples), cfg, generator, name="sft",
                       device=device, on_log=on_log, checkpointer=checkpointer,
                       progress=progress, precision=precision, dp=dp,
                       count=lambda idx: float(np.sum(n_tokens[idx.numpy()])),
                       summed=("train/tokens",), streams={"ptx": mix} if mix else None)


EVAL_LOGITS_BYTES = 64 * 2**20  # the most float32 logits one evaluation forward pass makes


@torch.inference_mode()
def sft_eval_loss(model, examples: SFTExamples, pad_id: int, device: torch.device,
                  batch_size: int = 64) -> float:
    """Token-averaged response loss on held-out examples; a batch whose float32 logits would
    pass EVAL_LOGITS_BYTES runs a few rows at a time."""
    examples = examples.with_loss_on("response")
    model.eval()
    vocab = model.get_output_embeddings().weight.shape[0]
    total, count = 0.0, 0
    for start in range(0, len(examples), batch_size):
        batch = [examples[i] for i in range(start, min(start + batch_size, len(examples)))]
        ids, mask, labels = sft_batch(batch, pad_id, device)
        rows = max(1, EVAL_LOGITS_BYTES // (ids.shape[1] * vocab * 4))
        for a in range(0, len(batch), rows):
            b = a + rows
            loss, stats = supervised_loss(model, ids[a:b], mask[a:b], labels[a:b])
            total += float(loss) * float(stats["num_tokens"])
            count += int(stats["num_tokens"])
    model.train()
    return total / max(count, 1)
