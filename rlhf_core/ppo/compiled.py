"""``ppo.compile``: the update's forward and backward through torch.compile, one decoder
block at a time.

Compiling a whole transformer (or the whole loss function) makes torch.compile trace every
layer and, with shapes that change between minibatches, reason about them symbolically: at
87M parameters that warm-up did not finish. Here each trained model's repeated block (the
classes a Hugging Face model names in ``_no_split_modules``: ``GPT2Block``, ``LlamaDecoderLayer``,
``Qwen2DecoderLayer``...) is compiled with static shapes ("regional" compilation): the blocks of
one class share their compiled code, so the warm-up costs about one block's forward and
backward, and what compiling buys (fused normalisation, activation and residual kernels in
place of many small eager ones) is where the update spends its kernel launches.

The compiled blocks are switched on only inside the update (:meth:`CompiledBlocks.active`):
the rollout's generation (KV caches, one-token steps) stays eager. The update's minibatches
have static shapes when ``ppo.compile`` is on: the rollout is padded to ``max_new_tokens``
response tokens and the prompts to a multiple of 16 (:func:`pad_responses`), so a run
compiles once per prompt width.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

RECOMPILE_LIMIT = 32  # prompt widths x micro-batch row counts a run may see


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The decoder blocks of every Hugging Face model inside ``model`` (a causal LM, a
    scalar-head model's trunk, a LoRA wrapper): the modules whose class the model names in
    ``_no_split_modules``. A model that names none has no block to compile: []."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


class CompiledBlocks:
    """Compiled twins of the trained models' decoder blocks, used while :meth:`active`."""

    def __init__(self, models: Iterable[nn.Module | None]):
        import torch._dynamo.config as dynamo_config

        # one compiled graph per block class and shape; raise the per-code limit so a run's
        # few prompt widths never fall back to eager
        limit = max(getattr(dynamo_config, "recompile_limit", 8), RECOMPILE_LIMIT)
        if hasattr(dynamo_config, "recompile_limit"):
            dynamo_config.recompile_limit = limit
        else:  # older torch
            dynamo_config.cache_size_limit = limit
        self.blocks = [block for model in models if model is not None
                       for block in repeated_blocks(model)]
        if not self.blocks:
            raise ValueError("ppo.compile: the model names no repeated block class "
                             "(_no_split_modules) to compile; set ppo.compile: false")
        self.compiled = [torch.compile(block._call_impl, dynamic=False)
                         for block in self.blocks]

    @contextmanager
    def active(self) -> Iterator[None]:
        """Calls of the blocks run their compiled twins inside the context, eager outside."""
        for block, fn in zip(self.blocks, self.compiled):
            block._compiled_call_impl = fn
        try:
            yield
        finally:
            for block in self.blocks:
                block._compiled_call_impl = None


def padded_width(width: int, multiple: int) -> int:
    """``width`` rounded up to a multiple of ``multiple``."""
    return width + (-width % multiple)
