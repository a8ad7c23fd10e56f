"""The hardware and build facts a run's numbers depend on, as strings for run tags (a seed is
bit-identical only on one kind of machine); "unknown" where unreadable; torch imported lazily.
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
    """The name of ``device``'s GPU (None or "auto": the current one), else "none"."""
    import torch

    device = torch.device("cuda" if device is None or str(device) == "auto" else device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "none"
    return torch.cuda.get_device_name(device)


def cpu_bf16_units() -> str:
    """The CPU's native bf16 matmul units: "amx", "avx512_bf16", else "none" (emulated)."""
    import torch

    for name, probe in (("amx", "_is_amx_tile_supported"),
                        ("avx512_bf16", "_is_avx512_bf16_supported")):
        check = getattr(torch.cpu, probe, None)
        if check is not None and check():
            return name
    return "none"


def hardware_facts(device: torch.device | str | None = None) -> dict[str, str]:
    """The facts by name, each a string; never raises."""
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
