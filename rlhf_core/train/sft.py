"""Stage 2, supervised fine-tuning: causal-LM loss on prompt + response + EOS.

Loss on response tokens only by default (the prompt is given, not generated); AdamW eps 1e-5,
warm-up then decay, dropout off (README § Sources [N+]).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlhf_core.config import SFTConfig
from rlhf_core.models.checkpoint import Checkpointer
from rlhf_core.models.data import IGNORE_INDEX, encode_sft, right_pad
from rlhf_core.parallel.distributed import DataParallel
from rlhf_core.train.loop import train_steps
from rlhf_core.train.losses import sft_loss
from rlhf_core.train.optim import LogFn


def encode_sft_rows(tokenizer, rows: Sequence[dict], loss_on: str):
    """rows of {prompt, response} -> list of (input_ids, labels)."""
    return [encode_sft(tokenizer, r["prompt"], r["response"], loss_on) for r in rows]


def sft_batch(examples, pad_id: int, device: torch.device):
    """-> input_ids, attention_mask, labels, each [B, T] (T = longest in the batch)."""
    ids = right_pad([e[0] for e in examples], pad_id).to(device)
    labels = right_pad([e[1] for e in examples], IGNORE_INDEX).to(device)
    return ids, ids != pad_id, labels


def train_sft(
    model, tokenizer, rows: Sequence[dict], cfg: SFTConfig, device: torch.device,
    generator: torch.Generator, *, on_log: LogFn | None = None, progress: bool = True,
    checkpointer: Checkpointer | None = None, precision: str = "fp32",
    dp: DataParallel | None = None,
) -> dict[str, float]:
    """Fine-tune ``model`` in place on ``rows``; returns the final metrics.

    Args:
        rows: dicts with 'prompt' and 'response' (text; EOS appended here).
        generator: CPU generator for the data order (reproducible).
        on_log: called as on_log(step, metrics) every cfg.log_every steps.
        checkpointer: periodic training-state checkpoints; resumes from the latest one.
        precision: fp32 | bf16 | fp16 (resolved; see rlhf_core.models.precision).
        dp: data parallel: this rank trains on its shard of each global batch (DDP).
    """
    examples = encode_sft_rows(tokenizer, rows, cfg.loss_on)
    model.to(device)
    pad_id = tokenizer.pad_token_id
    net = dp.wrap(model) if dp is not None else model
    # supervised (shifted) tokens per example: the loss is a mean over these
    n_tokens = [sum(label != IGNORE_INDEX for label in e[1][1:]) for e in examples]

    def loss_fn(idx: torch.Tensor):
        ids, mask, labels = sft_batch([examples[i] for i in idx], pad_id, device)
        logits = net(input_ids=ids, attention_mask=mask, use_cache=False).logits
        loss, stats = sft_loss(logits, labels)
        return loss, {"train/tokens": float(stats["num_tokens"])}

    return train_steps(model, loss_fn, len(examples), cfg.batch_size, cfg.epochs, cfg.optim,
                       generator, name="sft", log_every=cfg.log_every, on_log=on_log,
                       checkpointer=checkpointer, progress=progress, precision=precision,
                       device=device, dp=dp, net=net,
                       count=lambda idx: float(sum(n_tokens[i] for i in idx)),
                       summed=("train/tokens",))


@torch.inference_mode()
def sft_eval_loss(model, tokenizer, rows: Sequence[dict], device: torch.device,
                  batch_size: int = 64) -> float:
    """Token-averaged response loss on held-out rows."""
    model.eval()
    examples = encode_sft_rows(tokenizer, rows, "response")
    total, count = 0.0, 0
    for start in range(0, len(examples), batch_size):
        ids, mask, labels = sft_batch(examples[start: start + batch_size],
                                      tokenizer.pad_token_id, device)
        loss, stats = sft_loss(model(input_ids=ids, attention_mask=mask).logits, labels)
        total += float(loss) * float(stats["num_tokens"])
        count += int(stats["num_tokens"])
    model.train()
    return total / max(count, 1)
