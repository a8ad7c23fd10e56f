"""Stage 2, supervised fine-tuning: causal-LM loss on prompt + response + EOS.

Loss on response tokens only by default (the prompt is given, not generated); AdamW eps 1e-5,
warm-up then decay, dropout off (Huang et al. 2024).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from rlhf_core.config import SFTConfig
from rlhf_core.data import IGNORE_INDEX, batches, encode_sft, right_pad
from rlhf_core.losses import sft_loss
from rlhf_core.optim import LogFn, build_optimizer, check_finite


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
    generator: torch.Generator, on_log: LogFn | None = None, progress: bool = True,
) -> dict[str, float]:
    """Fine-tune ``model`` in place on ``rows``; returns the final metrics.

    Args:
        rows: dicts with 'prompt' and 'response' (text; EOS appended here).
        generator: CPU generator for the data order (reproducible).
        on_log: called as on_log(step, metrics) every cfg.log_every steps.
    """
    examples = encode_sft_rows(tokenizer, rows, cfg.loss_on)
    steps_per_epoch = math.ceil(len(examples) / cfg.batch_size)
    total = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    optimizer, scheduler = build_optimizer(model.parameters(), cfg.optim, total)
    model.to(device).train()
    pad_id = tokenizer.pad_token_id
    step, last = 0, {}
    bar = tqdm(total=total, desc="sft", disable=not progress, leave=False)
    while step < total:
        for idx in batches(len(examples), cfg.batch_size, generator):
            ids, mask, labels = sft_batch([examples[i] for i in idx], pad_id, device)
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            loss, stats = sft_loss(logits, labels)
            check_finite("sft loss", loss, step)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)
            optimizer.step()
            scheduler.step()
            step += 1
            bar.update(1)
            last = {"train/loss": float(loss), "train/grad_norm": float(grad_norm),
                    "train/lr": scheduler.get_last_lr()[0],
                    "train/tokens": float(stats["num_tokens"])}
            if on_log and (step % cfg.log_every == 0 or step == total):
                on_log(step, last)
            if step >= total:
                break
    bar.close()
    return last


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
