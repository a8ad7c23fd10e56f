"""The one model loader: every model and tokenizer of the pipeline loads through here.

A :class:`LoadSpec`, built once from the model config and the device, carries what
``from_pretrained`` needs. Trained models keep ``model.dtype`` master weights under autocast;
frozen ones load in the compute dtype, as nothing updates them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rlhf_core.config import LoraSettings, ModelConfig
from rlhf_core.models.adapters import (
    is_adapter_folder,
    load_adapted_causal_lm,
    load_adapted_scalar,
    peft_reading_old_names,
    trunk_of,
)
from rlhf_core.models.models import ScalarHeadModel, load_causal_lm
from rlhf_core.models.precision import enable_tf32, resolve_precision

_COMPUTE_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class LoadSpec:
    """How to load a model: built by :meth:`from_config`, passed to every load below."""

    dtype: str = "float32"
    precision: str = "fp32"
    attn_implementation: str = "auto"
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    lora: LoraSettings | None = None

    @classmethod
    def from_config(cls, cfg: ModelConfig, device: torch.device | str) -> LoadSpec:
        """Resolve ``precision: auto`` for the device; turn TF32 on for CUDA."""
        enable_tf32(device)
        return cls(dtype=cfg.dtype,
                   precision=resolve_precision(cfg.precision, device, bool(cfg.base_model)),
                   attn_implementation=cfg.attn_implementation,
                   trust_remote_code=cfg.trust_remote_code,
                   gradient_checkpointing=cfg.gradient_checkpointing, lora=cfg.lora)

    def param_dtype(self, trainable: bool) -> str:
        """Trained: ``dtype`` (fp32 master weights); frozen: the compute dtype."""
        if trainable or self.dtype != "float32":
            return self.dtype
        return _COMPUTE_DTYPE_NAMES.get(self.precision, "float32")

    def hf_kwargs(self) -> dict:
        """Extra ``from_pretrained`` arguments (the attention kernel, unless 'auto')."""
        if self.attn_implementation == "auto":
            return {}
        return {"attn_implementation": self.attn_implementation}


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


class TanhGELU(torch.nn.Module):
    """GELU's tanh approximation as torch's fused kernel: transformers' ``gelu_new`` (GPT-2
    and kin) in one kernel instead of ~8 elementwise ops."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh")


def fuse_activations(model: torch.nn.Module) -> int:
    """Swap every ``gelu_new`` module for :class:`TanhGELU` in place -> how many."""
    from transformers.activations import NewGELUActivation

    swapped = 0
    for module in model.modules():
        for name, child in module.named_children():
            if isinstance(child, NewGELUActivation):
                setattr(module, name, TanhGELU())
                swapped += 1
    return swapped


def _finish(model, spec: LoadSpec, trainable: bool):
    fuse_activations(model)
    if trainable and spec.gradient_checkpointing:
        backbone = model.backbone if isinstance(model, ScalarHeadModel) else model
        enable_checkpointing(backbone)
    if not trainable:
        model.eval().requires_grad_(False)
    return model


def load_policy(name_or_path: str | Path, spec: LoadSpec, trainable: bool = True):
    """A causal LM, trained or frozen; an adapter folder loads with its chain merged."""
    args = (spec.param_dtype(trainable), spec.trust_remote_code)
    if is_adapter_folder(name_or_path):
        model = load_adapted_causal_lm(name_or_path, *args, **spec.hf_kwargs())
    else:
        model = load_causal_lm(name_or_path, *args, **spec.hf_kwargs())
    return _finish(model, spec, trainable)


def load_scalar_model(model_dir: str | Path, spec: LoadSpec,
                      trainable: bool = True) -> ScalarHeadModel:
    """A saved scalar-head model (reward model, critic); an adapter folder merged."""
    args = (spec.param_dtype(trainable), spec.trust_remote_code)
    if is_adapter_folder(model_dir):
        model = load_adapted_scalar(model_dir, *args, **spec.hf_kwargs())
    else:
        model = ScalarHeadModel.load(model_dir, *args, **spec.hf_kwargs())
    return _finish(model, spec, trainable)


def new_scalar_model(name_or_path: str | Path, spec: LoadSpec,
                     trainable: bool = True) -> ScalarHeadModel:
    """A fresh scalar head on a causal LM's trunk (the reward model before training)."""
    if is_adapter_folder(name_or_path):
        trunk = trunk_of(name_or_path, spec.param_dtype(trainable), spec.trust_remote_code,
                         **spec.hf_kwargs())
        return _finish(ScalarHeadModel(trunk), spec, trainable)
    model = ScalarHeadModel.from_causal_lm(name_or_path, spec.param_dtype(trainable),
                                           spec.trust_remote_code, **spec.hf_kwargs())
    return _finish(model, spec, trainable)


def add_lora(model, settings: LoraSettings):
    """Wrap a transformers model in peft LoRA adapters (base frozen) -> PeftModel."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:  # pragma: no cover - depends on the optional extra
        raise ImportError("model.lora needs peft: pip install 'rlhf-ppo-pipeline[lora]'") \
            from err
    cfg = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                     target_modules=settings.target_modules, bias="none")
    with peft_reading_old_names():
        return get_peft_model(model, cfg)

