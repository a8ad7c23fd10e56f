"""The one model loader: every model and tokenizer loads here, with a :class:`LoadSpec` built
once from the model config; trained models keep ``model.dtype`` master weights under autocast,
frozen ones load in the compute dtype. Under LoRA (``model.lora``) the reference and the reward
model are the policy's and the critic's trunks with adapters off: two frozen trunks, not four.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM

from rlhf_core.config import LoraSettings, ModelConfig
from rlhf_core.models.adapters import (
    base_of,
    is_adapter_folder,
    merge_adapter,
    peft_reading_old_names,
)
from rlhf_core.models.models import PPOModels, ScalarHeadModel, disable_dropout
from rlhf_core.models.precision import COMPUTE_DTYPES, choose_precision


@dataclass(frozen=True)
class LoadSpec:
    dtype: str = "float32"
    precision: str = "fp32"
    attn_implementation: str = "auto"
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    lora: LoraSettings | None = None

    @classmethod
    def from_config(cls, cfg: ModelConfig, device: torch.device | str) -> LoadSpec:
        """Resolve ``precision: auto`` for the device; TF32 on for CUDA."""
        if torch.device(device).type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        return cls(dtype=cfg.dtype,
                   precision=choose_precision(cfg.precision, device, bool(cfg.base_model))[0],
                   attn_implementation=cfg.attn_implementation,
                   trust_remote_code=cfg.trust_remote_code,
                   gradient_checkpointing=cfg.gradient_checkpointing, lora=cfg.lora)

    def pretrained(self, trainable: bool) -> dict:
        """``from_pretrained``'s arguments (frozen: in the compute dtype)."""
        dtype = getattr(torch, self.dtype)
        if not trainable and dtype == torch.float32:
            dtype = COMPUTE_DTYPES[self.precision]
        kernel = {} if self.attn_implementation == "auto" else \
            {"attn_implementation": self.attn_implementation}
        return {"dtype": dtype, "trust_remote_code": self.trust_remote_code, **kernel}


def load_tokenizer(name_or_path: str | Path, spec: LoadSpec = LoadSpec()):
    """AutoTokenizer with right padding (left padding is done by hand)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(name_or_path),
                                              trust_remote_code=spec.trust_remote_code)
    tokenizer.padding_side = "right"
    return tokenizer


def enable_checkpointing(model) -> None:
    """Activation (gradient) checkpointing, non-reentrant, under either transformers name."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable({"use_reentrant": False})


class TanhGELU(nn.Module):
    """transformers' ``gelu_new`` (GPT-2 and kin) as torch's fused kernel, not ~8 ops."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x, approximate="tanh")


def _contiguous_rows(head: nn.Module, args: tuple):
    """The LM head's pre-hook: on a CPU a bf16 product of ``logits_to_keep``'s strided rows
    with a frozen weight copies the whole weight per row (20x slower for a 49k-token
    vocabulary); a contiguous copy gives the same bits. fp32, other devices: as is."""
    x = args[0]
    if x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16) \
            and not x.is_contiguous():
        return (x.contiguous(), *args[1:])
    return None


ModelKind = Literal["policy", "scalar", "new_head"]


def load_pretrained(path: str | Path, spec: LoadSpec, kind: ModelKind = "policy",
                    trainable: bool = True):
    """Load a ``policy`` (a causal LM), a saved ``scalar`` model (reward model, critic) or a
    ``new_head``: a fresh scalar head on a causal LM's trunk (the reward model before
    training), trained or frozen; an adapter folder loads with its chain merged. Every
    ``gelu_new`` becomes a :class:`TanhGELU`; the LM head gets :func:`_contiguous_rows`."""
    from transformers.activations import NewGELUActivation

    model = _load(path, kind, spec.pretrained(trainable))
    for module in model.modules():
        for name, child in module.named_children():
            if isinstance(child, NewGELUActivation):
                setattr(module, name, TanhGELU())
    if hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None:
        model.get_output_embeddings().register_forward_pre_hook(_contiguous_rows)
    if trainable and spec.gradient_checkpointing:
        enable_checkpointing(model.backbone if isinstance(model, ScalarHeadModel) else model)
    if not trainable:
        model.eval().requires_grad_(False)
    return model


def _load(path: str | Path, kind: str, pretrained: dict):
    """:func:`load_pretrained`'s model, dropout off; ``kind`` ``trunk``: the transformer trunk
    of a scalar model's or a causal LM's folder."""
    folder = Path(path)
    if kind == "trunk":
        scalar = (folder / "scalar_head.json").is_file()
        model = _load(path, "scalar" if scalar else "policy", pretrained)
        return model.backbone if scalar else model.base_model
    if kind == "new_head":  # a hub id or a causal LM's folder
        trunk = _load(path, "trunk", pretrained) if is_adapter_folder(path) else \
            disable_dropout(AutoModel.from_pretrained(str(path), **pretrained))
        return ScalarHeadModel(trunk)
    if is_adapter_folder(path):
        base = base_of(path)
        if kind == "policy":
            return merge_adapter(_load(base, "policy", pretrained), path)
        trunk = merge_adapter(_load(base, "trunk", pretrained), path)
    elif kind == "policy":
        return disable_dropout(AutoModelForCausalLM.from_pretrained(str(path), **pretrained))
    else:
        for name in ("backbone", "head.safetensors", "scalar_head.json"):
            if not (folder / name).exists():
                raise FileNotFoundError(f"{folder}: not a scalar-head model (missing {name})")
        trunk = disable_dropout(AutoModel.from_pretrained(str(folder / "backbone"), **pretrained))
    head = nn.Linear(trunk.config.hidden_size, 1)
    head.load_state_dict(load_file(str(folder / "head.safetensors")))
    return ScalarHeadModel(trunk, head)


def add_lora(model, settings: LoraSettings):
    """Wrap a transformers model in peft LoRA adapters (base frozen) -> PeftModel."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:  # pragma: no cover - depends on the optional extra
        raise ImportError("model.lora needs peft: pip install 'rlhf-ppo-pipeline[lora]'") from err
    cfg = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                     target_modules=settings.target_modules, bias="none")
    with peft_reading_old_names():
        return get_peft_model(model, cfg)


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
        value = None if critic_dir is None else load_pretrained(critic_dir, spec, "scalar")
        return PPOModels(load_pretrained(policy_dir, spec),
                         load_pretrained(ref_dir, spec, trainable=False), value,
                         load_pretrained(reward_dir, spec, "scalar", trainable=False))
    base = load_pretrained(policy_dir, spec, trainable=False)
    trunk = load_pretrained(reward_dir, spec, "scalar", trainable=False)
    if spec.gradient_checkpointing:
        enable_checkpointing(base)
    policy = add_lora(base, spec.lora)
    if critic_dir is None:
        return PPOModels(policy, AdaptersOff(policy), None, trunk)
    # a new head has its own trunk; else the critic is a copy of the reward model's head on
    # the reward trunk's adapters, and the reward model that trunk with its adapters off
    critic = load_pretrained(critic_dir, spec, "new_head", trainable=False) if new_head else \
        ScalarHeadModel(trunk.backbone, copy.deepcopy(trunk.head))
    if spec.gradient_checkpointing:
        enable_checkpointing(critic.backbone)
    value = adapt_scalar(critic, spec.lora)
    reward = trunk if new_head else ScalarHeadModel(AdaptersOff(value.backbone), trunk.head)
    return PPOModels(policy, AdaptersOff(policy), value, reward)


def adapt_scalar(model: ScalarHeadModel, settings) -> ScalarHeadModel:
    """A scalar model to train under LoRA: adapters on its trunk, its head in full (fp32)."""
    adapted = ScalarHeadModel(add_lora(model.backbone, settings), model.head.requires_grad_(True))
    adapted.head.float()  # trained: fp32 master weights over a frozen bf16/fp16 trunk too
    return adapted
