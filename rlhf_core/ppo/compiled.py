"""``ppo.compile``: the update's forward and backward through torch.compile, one decoder block
at a time ("regional" compilation, static shapes); generation stays eager."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

RECOMPILE_LIMIT = 32  # ppo.compile: prompt widths x micro-batch row counts a run may see


class CompiledBlocks:
    """Compiled twins of the trained models' decoder blocks, used while :meth:`active`.
    Compiling a whole transformer makes the warm-up trace every layer; the blocks of one class
    share their compiled code, so warm-up costs about one block."""

    def __init__(self, models: Iterable[torch.nn.Module | None]):
        import torch._dynamo.config as dynamo_config

        # one graph per block class and shape: a run's few widths must not fall back to eager
        limit = max(getattr(dynamo_config, "recompile_limit", 8), RECOMPILE_LIMIT)
        if hasattr(dynamo_config, "recompile_limit"):
            dynamo_config.recompile_limit = limit
        else:  # older torch
            dynamo_config.cache_size_limit = limit
        # the decoder blocks of every Hugging Face model inside the models: the modules
        # whose class it names in ``_no_split_modules``
        self.blocks: list[torch.nn.Module] = []
        for model in (m for m in models if m is not None):
            names: set[str] = set()
            for module in model.modules():
                names.update(getattr(module, "_no_split_modules", None) or ())
            self.blocks += [m for m in model.modules() if type(m).__name__ in names]
        if not self.blocks:
            raise ValueError("ppo.compile: the model names no repeated block class "
                             "(_no_split_modules) to compile; set ppo.compile: false")
        self.compiled = [torch.compile(block._call_impl, dynamic=False) for block in self.blocks]

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
