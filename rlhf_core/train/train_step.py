"""The one training-step seam of SFT, reward-model training and PPO: micro-batch losses under
autocast, weighted backward, unscale, global clip, one finite check before the optimizer
applies anything (the fp16 scaler's state is not checkpointed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import nullcontext

import torch

from rlhf_core.models.precision import autocast
from rlhf_core.parallel.fsdp import full_norm
from rlhf_core.train.optim import check_finite

# A micro-batch: () -> (loss, weight); the step's loss is sum(weight * loss).
MicroBatch = Callable[[], tuple[torch.Tensor, float]]


class TrainStep:
    """Autocast, backward, clip, finite checks and the optimizer step for one set of params."""

    def __init__(self, params: Iterable[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                 scheduler, max_grad_norm: float, precision: str = "fp32",
                 device: torch.device | str = "cpu", name: str = "train",
                 no_sync: Callable | None = None,
                 groups: dict[str, Iterable[torch.nn.Parameter]] | None = None):
        """``no_sync``: DDP's ``no_sync``, so only a step's last micro-batch all-reduces;
        ``groups``: named parameter groups whose pre-clip norms go to :attr:`group_norms`."""
        self.params = [p for p in params if p.requires_grad]
        self.groups = {name: [p for p in group if p.requires_grad]
                       for name, group in (groups or {}).items()}
        self.group_norms: dict[str, torch.Tensor] = {}
        self.optimizer, self.scheduler = optimizer, scheduler
        self.max_grad_norm, self.precision = max_grad_norm, precision
        self.device, self.name = torch.device(device), name
        self.scaler = (torch.amp.GradScaler(self.device.type) if precision == "fp16" else None)
        self.skipped = 0  # fp16 steps skipped for an overflowing gradient
        self.no_sync = no_sync

    def autocast(self):
        """The forward context of this precision (nothing in fp32)."""
        return autocast(self.precision, self.device)

    def run(self, micro_batches: Iterable[MicroBatch], step: int) -> torch.Tensor:
        """One optimizer step over the micro-batches -> the pre-clip gradient norm."""
        self.optimizer.zero_grad(set_to_none=True)
        micro_batches, losses = list(micro_batches), []
        for i, micro in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            with nullcontext() if last or self.no_sync is None else self.no_sync():
                with self.autocast():
                    loss, weight = micro()
                losses.append(loss.detach())
                scaled = loss if weight == 1.0 else loss * weight
                if self.scaler is not None:
                    scaled = self.scaler.scale(scaled)
                scaled.backward()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        self.group_norms = {}  # each group's gradient 2-norm (0 when none has one)
        for name, group in self.groups.items():
            grads = [p.grad for p in group if p.grad is not None]
            self.group_norms[name] = full_norm(torch.nn.utils.get_total_norm(grads)) if grads \
                else torch.zeros(())
        grad_norm = full_norm(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm))
        stacked = torch.stack([loss.float() for loss in losses])
        finite = torch.stack([torch.isfinite(stacked).all(), torch.isfinite(grad_norm)]).tolist()
        if not finite[0]:
            bad = next(loss for loss in losses if not torch.isfinite(loss).all())
            check_finite(f"{self.name} loss", bad, step)
        if self.scaler is not None and not finite[1]:
            self.skipped += 1  # fp16 overflow: the scaler skips this step and lowers its scale
        elif not finite[1]:
            check_finite(f"{self.name} gradient norm", grad_norm, step)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        return grad_norm
