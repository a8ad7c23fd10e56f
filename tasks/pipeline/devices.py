"""A stage's torch set-up from the ``model:`` section: threads, device and the load spec."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlhf_core.config import ModelConfig

if TYPE_CHECKING:  # torch and the model code load with the first model, not this module
    import torch

    from rlhf_core.models.loader import LoadSpec


def setup_torch(model_cfg: ModelConfig) -> torch.device:
    import torch

    from rlhf_core.models.models import resolve_device

    if model_cfg.torch_threads:
        torch.set_num_threads(model_cfg.torch_threads)
    return resolve_device(model_cfg.device)


def setup_models(model_cfg: ModelConfig) -> tuple[torch.device, LoadSpec]:
    """The device and the one load spec every model and tokenizer load of a stage uses."""
    from rlhf_core.models.loader import LoadSpec

    device = setup_torch(model_cfg)
    return device, LoadSpec.from_config(model_cfg, device)
