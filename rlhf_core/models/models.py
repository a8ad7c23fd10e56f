"""The four models of RLHF: policy, reference, reward and value (loader.py loads them); the
reward and value models are a causal LM's trunk plus a scalar head (README § Sources [RM]:
init std 1/sqrt(hidden+1), bias 0).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import logging as hf_logging

from rlhf_core.models.chat import stop_token_ids
from rlhf_core.models.checkpoint import atomic_dir

hf_logging.disable_progress_bar()  # per-file load/save bars drown the stages' own bars


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def disable_dropout(model: nn.Module) -> nn.Module:
    """Set every dropout probability to 0 (README § Sources [N+]: dropout off)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    config = getattr(model, "config", None)
    if config is not None:
        for key, value in config.to_dict().items():
            if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
                setattr(config, key, 0.0)
    return model


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: [B, T] -> [B, T] (0 at the first real token)."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


class ScalarHeadModel(nn.Module):
    """A transformer trunk with a scalar head -> per-token scores [B, T] (reward or value)."""

    def __init__(self, backbone: PreTrainedModel, head: nn.Linear | None = None):
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.hidden_size
        if head is None:
            head = nn.Linear(hidden, 1)
            nn.init.normal_(head.weight, std=1.0 / math.sqrt(hidden + 1))
            nn.init.zeros_(head.bias)
        self.head = head.to(next(backbone.parameters()).dtype)

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask [B, T] -> the trunk's last hidden states [B, T, H]."""
        return self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids_from_mask(attention_mask),
                             use_cache=False).last_hidden_state

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, T, H] -> scores [B, T], float32 under autocast too."""
        return self.head(hidden).squeeze(-1).float()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask [B, T] -> scores [B, T]."""
        return self.scores(self.hidden(input_ids, attention_mask))

    def save(self, out_dir: str | Path) -> Path:
        """backbone/ (save_pretrained) and the head's files (:meth:`save_head`), atomically."""
        with atomic_dir(out_dir) as tmp:
            self.backbone.save_pretrained(tmp / "backbone")
            self.save_head(tmp)
        return Path(out_dir)

    def save_head(self, out: Path) -> None:
        """head.safetensors + scalar_head.json."""
        head = {k: v.detach().contiguous().cpu() for k, v in self.head.state_dict().items()}
        save_file(head, str(out / "head.safetensors"))
        meta = {"hidden_size": self.backbone.config.hidden_size, "kind": "scalar_head"}
        (out / "scalar_head.json").write_text(json.dumps(meta))


class PPOModels(NamedTuple):
    """The four models of a PPO run (``value_model`` None for a critic-free estimator)."""

    policy: nn.Module
    ref_policy: nn.Module
    value_model: ScalarHeadModel | None
    reward_model: ScalarHeadModel


def resize_for_tokenizer(model: PreTrainedModel, tokenizer) -> None:
    """Grow the embeddings for added tokens; make the generation config stop at the stop set."""
    if model.get_input_embeddings().num_embeddings < len(tokenizer):
        # mean-resizing, silenced: transformers announces it on every resize
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
        finally:
            hf_logging.set_verbosity(verbosity)
    had = model.config.eos_token_id  # one id, or a list of them (e.g. Llama 3.1's config)
    had = list(had) if isinstance(had, list | tuple) else [had]
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.pad_token_id = tokenizer.pad_token_id
        stops = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
        gen.eos_token_id = stops + had  # stop_token_ids reads them from here
        gen.eos_token_id = stop_token_ids(tokenizer, gen)
