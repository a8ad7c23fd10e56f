"""The rollout's sampling loop: the policy's own forward with a KV cache, one token a step,
without ``generate``'s machinery. With ``sampler=multinomial`` its tokens and logits are
``generate``'s bit for bit; the default :func:`inverse_cdf` draws one uniform per row.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rlhf_core.models.models import position_ids_from_mask

_KEYWORDS = ("input_ids", "attention_mask", "position_ids", "use_cache", "logits_to_keep")
# transformers 5.x calls the forward's KV-cache argument ``cache``; 4.x ``past_key_values``
CACHE_KEYWORDS = ("cache", "past_key_values")


def _forward_params(model):
    """The parameters of the forward a DDP or peft wrapper hands its keywords to."""
    base = getattr(model, "module", model)  # DistributedDataParallel's
    base = base.get_base_model() if hasattr(base, "get_base_model") else base
    return inspect.signature(base.forward).parameters


def cache_keyword(model) -> str:
    """The name ``model``'s forward gives its KV cache."""
    params = _forward_params(model)
    return next((name for name in CACHE_KEYWORDS if name in params), "past_key_values")


def takes_logits_to_keep(model) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep``."""
    return "logits_to_keep" in _forward_params(model)


def fits_lean_loop(model) -> bool:
    """Whether :func:`sample_responses` can drive ``model`` (else use ``generate``)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if supports is None or not supports():
        return False
    params = inspect.signature(model.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True  # e.g. a peft wrapper, which hands its keywords to the base model
    return all(name in params for name in _KEYWORDS) and \
        any(name in params for name in CACHE_KEYWORDS)


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` writing into buffers reserved for ``capacity`` positions and exposing
    the filled prefix, instead of ``torch.cat``-ing the whole cache each step."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            B, H, _, D = key_states.shape
            self.key_buffer = key_states.new_empty(B, H, self.capacity, D)
            self.value_buffer = value_states.new_empty(B, H, self.capacity, value_states.shape[-1])
        start = self.get_seq_length()  # the filled prefix (0 after a reset)
        end = start + key_states.shape[-2]
        if end > self.capacity:
            raise ValueError(f"KV cache reserved for {self.capacity} positions, asked for {end}")
        self.key_buffer[:, :, start:end].copy_(key_states)
        self.value_buffer[:, :, start:end].copy_(value_states)
        self.keys = self.key_buffer[:, :, :end]
        self.values = self.value_buffer[:, :, :end]
        return self.keys, self.values


def multinomial(probs: torch.Tensor) -> torch.Tensor:
    """``generate``'s draw: [B, V] probabilities -> [B] tokens."""
    return torch.multinomial(probs, num_samples=1).squeeze(1)


def inverse_cdf(probs: torch.Tensor) -> torch.Tensor:
    """One uniform per row, looked up in the cumulative probabilities: [B, V] -> [B] tokens;
    a zero-probability entry is never drawn."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    u = torch.rand(total.shape, device=probs.device, dtype=cdf.dtype) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True).squeeze(1)


@torch.inference_mode()
def sample_responses(policy, prompt_ids: torch.Tensor, pad_id: int, eos_id: int | list[int],
                     temperature: float, max_new_tokens: int, sampler=inverse_cdf):
    """Left-padded prompts [B, P] -> (responses [B, R], raw float32 logits [B, R, V]); R is
    the step every row had ended by, at most ``max_new_tokens``. ``eos_id``: one or a list."""
    B = prompt_ids.shape[0]
    stops = torch.tensor([eos_id] if isinstance(eos_id, int) else list(eos_id),
                         device=prompt_ids.device)
    cache_kw = cache_keyword(policy)
    mask = (prompt_ids != pad_id).long()
    position = position_ids_from_mask(mask)
    cache = DynamicCache(config=policy.config)  # its plain layers reserved for the whole run
    capacity = prompt_ids.shape[1] + max_new_tokens
    cache.layers = [ReservedLayer(capacity) if type(layer) is DynamicLayer else layer
                    for layer in cache.layers]
    alive = torch.ones(B, dtype=torch.long, device=prompt_ids.device)
    step_ids, ones = prompt_ids, mask.new_ones(B, 1)
    tokens, logits, forbidden = [], [], None
    for step in range(max_new_tokens):
        out = policy(input_ids=step_ids, attention_mask=mask, position_ids=position,
                     use_cache=True, logits_to_keep=1, return_dict=True, **{cache_kw: cache})
        raw = out.logits[:, -1].to(copy=True, dtype=torch.float32)  # (B, V)
        del out
        if forbidden is None:
            forbidden = torch.arange(raw.shape[-1], device=raw.device) == pad_id
        scores = torch.where(forbidden, -float("inf"), raw)
        if temperature != 1.0:
            scores = scores / temperature
        token = sampler(torch.softmax(scores, dim=-1))
        token = token * alive + pad_id * (1 - alive)  # an ended row gets PAD
        tokens.append(token)
        logits.append(raw)
        alive = alive & (~torch.isin(token, stops)).long()
        if step == max_new_tokens - 1 or not bool(alive.any()):
            break
        mask = torch.cat([mask, ones], dim=1)
        position = position[:, -1:] + 1
        step_ids = token[:, None]
    return torch.stack(tokens, dim=1), torch.stack(logits, dim=1)
