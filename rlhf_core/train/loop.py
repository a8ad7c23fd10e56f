"""The supervised training loop shared by SFT and reward-model training: one optimizer step
per shuffled batch, resumable from its checkpoints bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from rlhf_core.config import OptimConfig
from rlhf_core.faults import crash_point
from rlhf_core.memory import HeapTrimmer
from rlhf_core.models.checkpoint import Checkpointer
from rlhf_core.models.data import ShuffledBatches
from rlhf_core.parallel.distributed import CountFn, DataParallel, check_world_size
from rlhf_core.parallel.fsdp import Sharded, is_sharded
from rlhf_core.train.optim import LogFn, build_optimizer
from rlhf_core.train.train_step import TrainStep

LossFn = Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


def total_steps(n_examples: int, batch_size: int, epochs: float) -> int:
    return max(1, math.ceil(epochs * math.ceil(n_examples / batch_size)))


class _Shards:
    """This rank's shard of each batch and its loss weight (without ``dp``: all, weight 1)."""

    def __init__(self, dp: DataParallel | None, count: CountFn | None):
        self.dp, self.count = dp, count or (lambda idx: float(len(idx)))

    def split(self, idx: torch.Tensor) -> tuple[torch.Tensor, float, float]:
        """-> (indices to run, loss weight, this rank's count for the metric means)."""
        if self.dp is None:
            return idx, 1.0, 1.0
        local = self.dp.shard(idx)
        weight = self.dp.loss_weight(local, idx, self.count)
        if len(local) == 0:
            return idx[:1], 0.0, 0.0
        return local, weight, self.count(local)


def _resume_world(extra: dict, dp: DataParallel | None) -> None:
    check_world_size(extra.get("world_size", 1), 1 if dp is None else dp.world)


def train_steps(
    model: torch.nn.Module, loss_fn: LossFn, n_examples: int, batch_size: int, epochs: float,
    optim: OptimConfig, generator: torch.Generator, *, name: str, log_every: int,
    on_log: LogFn | None = None, checkpointer: Checkpointer | None = None,
    progress: bool = True, precision: str = "fp32", device: torch.device | str = "cpu",
    dp: DataParallel | None = None, net: torch.nn.Module | None = None,
    count: CountFn | None = None, summed: Sequence[str] = (),
    streams: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """Train ``model`` in place with ``loss_fn(indices) -> (loss, extras)`` -> the last step's
    metrics. Under ``dp``, ``count(indices)`` is what a loss averages over; ``streams``: other
    data streams whose place the checkpoints keep."""
    streams = dict(streams or {})
    total = total_steps(n_examples, batch_size, epochs)
    model.train()
    # fsdp: the optimizer holds the sharded copy's parameters; ``model`` is the full copy
    sharded = Sharded(model, net) if is_sharded(net) else None
    params = list((net if sharded else model).parameters())
    optimizer, scheduler = build_optimizer(params, optim, total)
    trainer = TrainStep(params, optimizer, scheduler, optim.max_grad_norm,
                        precision, device, name, no_sync=getattr(net, "no_sync", None))
    sampler, shards = ShuffledBatches(n_examples, batch_size, generator), _Shards(dp, count)
    step, last, main = 0, {}, dp is None or dp.is_main
    saved_opt = sharded.optimizer_view(optimizer) if sharded else optimizer
    restored = checkpointer.restore(saved_opt, scheduler, generator, optim.lr) \
        if checkpointer else None
    if restored is not None:
        step, extra = restored
        _resume_world(extra, dp)
        if sharded:
            sharded.push()
        sampler.load_state_dict(extra["sampler"])
        for key, stream in streams.items():
            stream.load_state_dict(extra[key])
        last = extra["last"]
    bar = tqdm(total=total, initial=step, desc=name, disable=not (progress and main),
               leave=False)
    heap = HeapTrimmer()
    while step < total:
        (idx, weight, n_local), out = shards.split(sampler.next()), {}

        def micro(idx=idx, out=out, weight=weight):
            out["loss"], out["extras"] = loss_fn(idx)
            return out["loss"], weight

        grad_norm = trainer.run([micro], step + 1)
        loss, extras = out["loss"], out["extras"]
        step += 1
        bar.update(1)
        heap.tick()
        metrics = {"train/loss": loss.item(), **extras}
        if dp is not None:
            metrics = dp.global_metrics(metrics, n_local, summed)
        last = {"train/loss": metrics.pop("train/loss"), "train/grad_norm": float(grad_norm),
                "train/lr": scheduler.get_last_lr()[0], **metrics}
        if on_log and (step % log_every == 0 or step == total):
            on_log(step, last)
        if checkpointer and checkpointer.due(step, total):
            if sharded:  # every rank gathers the full weights and optimizer state
                sharded.gather()
                saved_opt.gather()
            if main:
                world = {} if dp is None else {"world_size": dp.world}
                checkpointer.save(step, saved_opt, scheduler, generator,
                                  {"sampler": sampler.state_dict(), "last": last, **world,
                                   **{k: v.state_dict() for k, v in streams.items()}})
        crash_point(f"{name}:step:{step}")
    bar.close()
    if sharded:
        sharded.finish(device)
    return last
