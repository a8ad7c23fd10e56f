"""The supervised training loop shared by SFT and reward-model training: one optimizer step
per shuffled batch, resumable from its checkpoints bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from tqdm.auto import tqdm

from rlhf_core.config import RewardConfig, SFTConfig
from rlhf_core.faults import crash_point
from rlhf_core.memory import HeapTrimmer
from rlhf_core.models.checkpoint import Checkpointer
from rlhf_core.models.data import ShuffledBatches
from rlhf_core.parallel.distributed import CountFn, DataParallel, check_world_size
from rlhf_core.parallel.fsdp import FullOptimizer, Sharded
from rlhf_core.train.optim import LogFn, build_optimizer
from rlhf_core.train.train_step import TrainStep

LossFn = Callable[[torch.nn.Module, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


def total_steps(n_examples: int, batch_size: int, epochs: float) -> int:
    return max(1, math.ceil(epochs * math.ceil(n_examples / batch_size)))


def train_steps(
    model: torch.nn.Module, loss_fn: LossFn, n_examples: int, cfg: SFTConfig | RewardConfig,
    generator: torch.Generator, *, name: str, device: torch.device,
    on_log: LogFn | None = None, checkpointer: Checkpointer | None = None,
    progress: bool = True, precision: str = "fp32", dp: DataParallel | None = None,
    count: CountFn | None = None, summed: Sequence[str] = (),
    streams: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """Train ``model`` in place on ``device`` by ``cfg``'s batch size, epochs, optimizer and
    log interval with ``loss_fn(net, indices) -> (loss, extras)`` -> the last step's metrics;
    ``net``: the model as trained (wrapped under ``dp``, where ``count(indices)`` is what a
    loss averages over). ``streams``: other data streams whose place the checkpoints keep."""
    streams = dict(streams or {})
    total = total_steps(n_examples, cfg.batch_size, cfg.epochs)
    model.to(device)
    net = dp.wrap(model) if dp is not None else model
    model.train()
    # fsdp: the optimizer holds the sharded copy's parameters; ``model`` is the full copy
    sharded = Sharded(model, net) if isinstance(net, FSDPModule) else None
    params = list((net if sharded else model).parameters())
    optimizer, scheduler = build_optimizer(params, cfg.optim, total)
    trainer = TrainStep(params, optimizer, scheduler, cfg.optim.max_grad_norm,
                        precision, device, name, no_sync=getattr(net, "no_sync", None))
    sampler = ShuffledBatches(n_examples, cfg.batch_size, generator)
    count = count or (lambda idx: float(len(idx)))
    step, last, main = 0, {}, dp is None or dp.is_main
    saved_opt = FullOptimizer(net, optimizer) if sharded else optimizer  # what is checkpointed
    restored = checkpointer.restore(saved_opt, scheduler, generator, cfg.optim.lr) \
        if checkpointer else None
    if restored is not None:
        step, extra = restored
        check_world_size(extra.get("world_size", 1), 1 if dp is None else dp.world)
        if sharded:
            sharded.push()
        sampler.load_state_dict(extra["sampler"])
        for key, stream in streams.items():
            stream.load_state_dict(extra[key])
        last = extra["last"]
    bar = tqdm(total=total, initial=step, desc=name, disable=not (progress and main), leave=False)
    heap = HeapTrimmer()
    while step < total:
        idx, out = sampler.next(), {}
        idx, weight, n_local = (idx, 1.0, 1.0) if dp is None else dp.split(idx, count)

        def micro(idx=idx, out=out, weight=weight):
            out["loss"], out["extras"] = loss_fn(net, idx)
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
        if on_log and (step % cfg.log_every == 0 or step == total):
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
    if sharded:  # the full weights back in ``model``, on the training device
        sharded.gather()
        model.to(device)
    return last
