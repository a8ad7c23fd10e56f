"""Data parallelism for the supervised loop (SFT, reward model): every rank draws the global
batch and trains on its contiguous shard, its loss weighted by ``world * count_shard /
count_global`` so DDP's mean gradient is the global batch's; only rank 0 writes and logs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from rlhf_core.models.checkpoint import Checkpointer
from rlhf_core.parallel.fsdp import shard
from rlhf_core.parallel.global_stats import all_reduce_sum, global_weighted_means

CountFn = Callable[[torch.Tensor], float]  # indices -> what the loss is a mean over


@dataclass
class DataParallel:
    """This rank's place in the data-parallel group and the helpers the loop needs."""

    rank: int
    world: int
    device: torch.device
    parallel: str = "ddp"  # model.parallel: ddp | fsdp (rlhf_core/parallel/fsdp.py)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """DDP around ``model`` (parameters shared with the bare model); fsdp: a sharded copy."""
        if self.parallel == "fsdp":
            return shard(model, self.device, self.world)
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DDP(model, device_ids=ids)

    def split(self, idx: torch.Tensor, count: CountFn) -> tuple[torch.Tensor, float, float]:
        """This rank's contiguous slice of the global batch ``idx`` -> (indices to run, loss
        weight world * count(slice) / count(idx) so DDP's mean is the global gradient, the
        slice's count for the metric means); an empty slice runs one row at weight 0."""
        local = torch.tensor_split(idx, self.world)[self.rank]
        if len(local) == 0:
            return idx[:1], 0.0, 0.0
        total = count(idx)
        return local, 0.0 if total == 0 else self.world * count(local) / total, count(local)

    def global_metrics(self, metrics: dict[str, float], weight: float,
                       summed: Sequence[str] = ()) -> dict[str, float]:
        """Per-shard means -> the global batch's, weighted by ``weight``; ``summed`` keys summed."""
        means = {k: v for k, v in metrics.items() if k not in summed}
        out = global_weighted_means(means, weight)
        if summed:
            keys = [k for k in summed if k in metrics]
            vals = torch.tensor([float(metrics[k]) if weight > 0 else 0.0 for k in keys])
            out.update(zip(keys, all_reduce_sum(vals).tolist()))
        return {k: out[k] for k in metrics}


def check_world_size(saved: int, world: int) -> None:
    """A checkpoint resumes only at the world size that wrote it (data order, seeds)."""
    if saved != world:
        raise ValueError(f"this checkpoint was written by {saved} rank(s); resume it with "
                         f"model.nproc={saved} (now {world})")


def check_same_checkpoint(folder: str | Path, dp: DataParallel) -> None:
    """Stop every rank unless all see the same latest checkpoint (rank 0 writes: share it)."""
    latest = Checkpointer(folder, {}, 0).latest()
    step = -1 if latest is None else int(latest.name.removeprefix("step_"))
    both = torch.tensor([step, -step], dtype=torch.float64, device=dp.device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)  # (max step, -min step) over the ranks
    if both[0].item() != -both[1].item():
        raise RuntimeError(
            f"rank {dp.rank} sees latest checkpoint step {step} in {folder}, other ranks "
            f"see steps {-int(both[1].item())}..{int(both[0].item())} (-1: none); to resume a "
            "stage on several machines, put tracking.workdir on a filesystem every node mounts "
            "at the same path (and leave RLHF_STAGE_WORKDIR unset there), or resume it on one "
            f"machine with model.nnodes=1 and model.nproc={dp.world}")


def init_from_env(device: torch.device, parallel: str = "ddp") -> DataParallel | None:
    """Join the torchrun group of the environment (None when WORLD_SIZE <= 1): gloo on CPU,
    nccl on CUDA (each rank on ``cuda:LOCAL_RANK``)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    if device.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise RuntimeError(f"rank {local} needs GPU {local}, but this machine has "
                               f"{torch.cuda.device_count()}: set model.nproc to at most that")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return DataParallel(dist.get_rank(), dist.get_world_size(), device, parallel)


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
