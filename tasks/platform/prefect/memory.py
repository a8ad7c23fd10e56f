"""Peak memory of a stage: process RSS sampled in a thread, and CUDA's allocator peak."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch


def state_bytes(*modules, optimizer=None) -> int:
    """Bytes of every parameter and buffer of ``modules`` plus the optimizer's tensors."""
    total = sum(t.numel() * t.element_size() for m in modules if m is not None
                for t in list(m.parameters()) + list(m.buffers()))
    if optimizer is not None:
        total += sum(v.numel() * v.element_size() for state in optimizer.state.values()
                     for v in state.values() if isinstance(v, torch.Tensor))
    return total


@contextmanager
def peak_memory(interval_s: float = 0.2):
    """A dict filled on exit with ``memory/peak_rss_gb`` and, on CUDA, ``memory/peak_gpu_gb``."""
    import psutil

    proc, out, stop = psutil.Process(), {}, threading.Event()
    peak = [proc.memory_info().rss]

    def sample() -> None:
        while not stop.wait(interval_s):
            peak[0] = max(peak[0], proc.memory_info().rss)

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    thread = threading.Thread(target=sample, daemon=True, name="peak-rss")
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()
        peak[0] = max(peak[0], proc.memory_info().rss)
        out["memory/peak_rss_gb"] = peak[0] / 2**30
        if cuda:
            out["memory/peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 2**30
