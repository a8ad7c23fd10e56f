"""The supervised training loop shared by SFT and reward-model training.

One optimizer step per batch from a :class:`ShuffledBatches` stream; a non-finite loss or
gradient stops it with the step number before any weight changes; a :class:`Checkpointer`
saves model, optimizer, scheduler, RNG and data position every N steps and, on a re-run,
continues from the latest checkpoint so the result equals an uninterrupted run bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from rlhf_core.checkpoint import Checkpointer
from rlhf_core.config import OptimConfig
from rlhf_core.data import ShuffledBatches
from rlhf_core.faults import crash_point
from rlhf_core.optim import LogFn, build_optimizer
from rlhf_core.train_step import TrainStep

LossFn = Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


def total_steps(n_examples: int, batch_size: int, epochs: float) -> int:
    return max(1, math.ceil(epochs * math.ceil(n_examples / batch_size)))


def train_steps(
    model: torch.nn.Module, loss_fn: LossFn, n_examples: int, batch_size: int, epochs: float,
    optim: OptimConfig, generator: torch.Generator, *, name: str, log_every: int,
    on_log: LogFn | None = None, checkpointer: Checkpointer | None = None,
    progress: bool = True, precision: str = "fp32", device: torch.device | str = "cpu",
) -> dict[str, float]:
    """Train ``model`` in place; ``loss_fn(indices) -> (loss, extra metrics)``, run under the
    precision's autocast through the shared :class:`TrainStep`.

    Returns the last step's metrics (train/loss, train/grad_norm, train/lr + extras).
    """
    total = total_steps(n_examples, batch_size, epochs)
    model.train()
    optimizer, scheduler = build_optimizer(model.parameters(), optim, total)
    trainer = TrainStep(model.parameters(), optimizer, scheduler, optim.max_grad_norm,
                        precision, device, name)
    sampler = ShuffledBatches(n_examples, batch_size, generator)
    step, last = 0, {}
    restored = checkpointer.restore(optimizer, scheduler, generator, optim.lr) \
        if checkpointer else None
    if restored is not None:
        step, extra = restored
        sampler.load_state_dict(extra["sampler"])
        last = extra["last"]
    bar = tqdm(total=total, initial=step, desc=name, disable=not progress, leave=False)
    while step < total:
        idx, out = sampler.next(), {}

        def micro(idx=idx, out=out):
            out["loss"], out["extras"] = loss_fn(idx)
            return out["loss"], 1.0

        grad_norm = trainer.run([micro], step + 1)
        loss, extras = out["loss"], out["extras"]
        step += 1
        bar.update(1)
        last = {"train/loss": loss.item(), "train/grad_norm": float(grad_norm),
                "train/lr": scheduler.get_last_lr()[0], **extras}
        if on_log and (step % log_every == 0 or step == total):
            on_log(step, last)
        if checkpointer and checkpointer.due(step, total):
            checkpointer.save(step, optimizer, scheduler, generator,
                              {"sampler": sampler.state_dict(), "last": last})
        crash_point(f"{name}:step:{step}")
    bar.close()
    return last
