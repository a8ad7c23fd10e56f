"""FSDP2 (``fully_shard``) for ``model.parallel: fsdp``: :func:`shard` trains a block-by-block
sharded copy of the stage's plain "home" model and :class:`Sharded` gathers its weights back,
so checkpoints and saved models keep the one-process format.
"""

from __future__ import annotations

import copy

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # rank 0 receives it
EVERYWHERE = StateDictOptions(full_state_dict=True)  # every rank receives it (PPO rollouts)


def shard(model: torch.nn.Module, device: torch.device, world: int,
          home_on_device: bool = False) -> torch.nn.Module:
    """A sharded training copy of ``model`` (each block, then the root); ``model`` itself
    stays the full home copy, on CPU unless ``home_on_device`` (PPO samples with it)."""
    net = copy.deepcopy(model).to(device)
    if not home_on_device:
        model.to("cpu")
    mesh = init_device_mesh(device.type, (world,))
    # the transformer blocks: the members of the model's first ModuleList
    blocks = next((m for m in net.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0),
                  [])
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """clip_grad_norm_ over sharded parameters returns a DTensor: its (global) value."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


class Sharded:
    """The home copy ``home`` and its sharded training copy ``net``, with the optimizer."""

    def __init__(self, home: torch.nn.Module, net: torch.nn.Module, everywhere: bool = False):
        self.home, self.net = home, net
        self.options = EVERYWHERE if everywhere else FULL

    def gather(self) -> None:
        """A collective: full weights of ``net`` into rank 0's ``home`` (all: ``everywhere``)."""
        full = get_model_state_dict(self.net, options=self.options)
        if not full:  # cpu_offload: only rank 0 receives the full state
            return
        missing, unexpected = self.home.load_state_dict(full, strict=False)
        seen, tied = {}, set()  # weights tied to another (GPT-2's lm_head to the embeddings)
        for name, tensor in self.home.state_dict(keep_vars=True).items():
            if id(tensor) in seen:
                tied.add(name)
            seen.setdefault(id(tensor), name)
        untied = [k for k in missing if k not in tied]
        if untied or unexpected:
            raise RuntimeError(f"fsdp gather: missing {untied}, unexpected {unexpected}")

    def push(self) -> None:
        """``home``'s weights into the shards (after a checkpoint restored ``home``)."""
        set_model_state_dict(self.net, self.home.state_dict(), options=FULL)


class FullOptimizer:
    """The optimizer as the Checkpointer sees it: its full state, gathered on every rank."""

    def __init__(self, net: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.net, self.optimizer = net, optimizer
        self._full = None

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def gather(self) -> FullOptimizer:
        self._full = get_optimizer_state_dict(self.net, self.optimizer, options=FULL)
        return self

    def state_dict(self) -> dict:
        if self._full is None:
            raise RuntimeError("fsdp: gather() the optimizer state on every rank first")
        return self._full

    def load_state_dict(self, state: dict) -> None:
        set_optimizer_state_dict(self.net, self.optimizer, state, options=FULL)
