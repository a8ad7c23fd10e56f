"""The hardware and build facts a run's numbers depend on, as strings (for run tags).

The same seed gives bit-identical figures run to run on one machine, not across CPU types:
torch's CPU kernels are picked per instruction set (AVX2, AVX512...), reductions split over
the intra-op threads, and GPUs and CUDA builds differ. Each fact is read defensively: one
that cannot be read is "unknown", and no exception leaves :func:`hardware_facts`. torch is
imported when the facts are read, not with this module: the CLI's read-only commands (``rlhf
runs``, ``rlhf status``) import the run bookkeeping that tags runs, and need no torch.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CPUINFO = Path("/proc/cpuinfo")
UNKNOWN = "unknown"


def _fact(read: Callable[[], object]) -> str:
    try:
        value = read()
    except Exception:  # noqa: BLE001 - a fact that cannot be read is unknown, never an error
        return UNKNOWN
    text = str(value).strip() if value is not None else ""
    return text or UNKNOWN


def _cpu_model() -> str:
    """The "model name" line of /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in CPUINFO.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor()


def _gpu(device: torch.device | str | None) -> str:
    """The name of the CUDA device ``device`` names ("cuda": the current one; None or
    "auto": the one an "auto" device picks), "none" for a CPU device or without CUDA."""
    import torch

    if device is None or str(device) == "auto":
        device = "cuda"
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "none"
    return torch.cuda.get_device_name(device)


def cpu_bf16_units() -> str:
    """The CPU's native bf16 matmul units as torch's kernels see them: "amx" (AMX tiles),
    "avx512_bf16", else "none" (bf16 there is emulated and slower than float32)."""
    import torch

    for name, probe in (("amx", "_is_amx_tile_supported"),
                        ("avx512_bf16", "_is_avx512_bf16_supported")):
        check = getattr(torch.cpu, probe, None)
        if check is not None and check():
            return name
    return "none"


def hardware_facts(device: torch.device | str | None = None) -> dict[str, str]:
    """cpu (model name), cpu_capability (the instruction set torch's CPU kernels use),
    cpu_bf16 (:func:`cpu_bf16_units`), cpu_cores, threads (torch's intra-op threads now),
    torch, cuda (the build's CUDA version, "none" for a CPU build), gpu (``device``'s GPU
    name, "none" on CPU), gpu_count (CUDA devices visible) and platform (OS and C library)."""
    import torch

    cuda = torch.cuda.is_available
    return {
        "cpu": _fact(_cpu_model),
        "cpu_capability": _fact(torch.backends.cpu.get_cpu_capability),
        "cpu_bf16": _fact(cpu_bf16_units),
        "cpu_cores": _fact(os.cpu_count),
        "threads": _fact(torch.get_num_threads),
        "torch": _fact(lambda: torch.__version__),
        "cuda": _fact(lambda: torch.version.cuda or "none"),
        "gpu": _fact(lambda: _gpu(device)),
        "gpu_count": _fact(lambda: torch.cuda.device_count() if cuda() else 0),
        "platform": _fact(platform.platform),
    }
