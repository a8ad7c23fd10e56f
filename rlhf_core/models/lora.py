"""PPO's four models, full or as LoRA adapters over frozen bases (``model.lora``, needs peft).

Under LoRA the reference is the policy with its adapters off, and the reward model the critic's
trunk with its adapters off: two frozen trunks instead of four models. The critic keeps its
warm start from the reward model, so it does not share the policy's base; a critic with a new
head on the start policy (no reward model among the reward's sources) has a trunk of its own.
"""

from __future__ import annotations

import copy
from pathlib import Path

from torch import nn

from rlhf_core.models.loader import (
    LoadSpec,
    add_lora,
    enable_checkpointing,
    load_policy,
    load_scalar_model,
    new_scalar_model,
)
from rlhf_core.models.models import PPOModels, ScalarHeadModel


class AdaptersOff(nn.Module):
    """A peft model's frozen base, run with its adapters disabled (no second copy); held in a
    list, not a submodule, so this view's ``requires_grad_``/``train``/``.to`` leave it alone."""

    def __init__(self, peft_model):
        super().__init__()
        self._owner = [peft_model]
        self.config = peft_model.config

    def forward(self, *args, **kwargs):
        owner = self._owner[0]
        with owner.disable_adapter():
            return owner(*args, **kwargs)

    def parameters(self, recurse: bool = True):
        return self._owner[0].parameters(recurse)

    def requires_grad_(self, requires_grad: bool = True):
        return self


def ppo_models(policy_dir: str | Path, ref_dir: str | Path, critic_dir: str | Path | None,
               reward_dir: str | Path, spec: LoadSpec, new_head: bool = False) -> PPOModels:
    """-> (policy, reference, value model, reward model), full or LoRA; ``critic_dir`` None:
    no value model; ``new_head`` (LoRA): ``critic_dir`` is a causal LM, the critic a new head
    on its trunk."""
    if spec.lora is None:
        value = None if critic_dir is None else load_scalar_model(critic_dir, spec)
        return PPOModels(load_policy(policy_dir, spec),
                         load_policy(ref_dir, spec, trainable=False), value,
                         load_scalar_model(reward_dir, spec, trainable=False))
    base = load_policy(policy_dir, spec, trainable=False)
    trunk = load_scalar_model(reward_dir, spec, trainable=False)
    if spec.gradient_checkpointing:
        enable_checkpointing(base)
    policy = add_lora(base, spec.lora)
    if critic_dir is None:
        return PPOModels(policy, AdaptersOff(policy), None, trunk)
    critic = new_scalar_model(critic_dir, spec, trainable=False) if new_head else trunk
    if spec.gradient_checkpointing:
        enable_checkpointing(critic.backbone)
    if new_head:  # its own trunk: the reward model stays whole
        return PPOModels(policy, AdaptersOff(policy), adapt_scalar(critic, spec.lora), trunk)
    value_backbone = add_lora(trunk.backbone, spec.lora)
    value_head = copy.deepcopy(trunk.head).float().requires_grad_(True)
    value = ScalarHeadModel(value_backbone, value_head)
    value.head.float()  # trained: fp32 master weights
    reward = ScalarHeadModel(AdaptersOff(value_backbone), trunk.head)
    return PPOModels(policy, AdaptersOff(policy), value, reward)


def adapt_scalar(model: ScalarHeadModel, settings) -> ScalarHeadModel:
    """A scalar model to train under LoRA: adapters on its trunk, its head in full (fp32)."""
    return ScalarHeadModel(add_lora(model.backbone, settings),
                           model.head.float().requires_grad_(True))
