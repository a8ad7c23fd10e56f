"""Where a base model comes from: a hub id, a local folder, or a GGUF file (also as
``package:<module>/<file>``) dequantized once into a float32 folder cached by its SHA-256.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import time
from pathlib import Path

PACKAGE_PREFIX = "package:"
MARKER = "rlhf_gguf.json"  # written last into a finished cache folder

log = logging.getLogger(__name__)


class ModelSourceError(ValueError):
    """A model source that cannot be used; the message names it and the fix."""


def package_file(source: str) -> Path:
    """``package:<module>/<relative path>`` -> the file inside the installed package."""
    module, _, rel = source.removeprefix(PACKAGE_PREFIX).partition("/")
    spec = importlib.util.find_spec(module) if module else None
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(f"{source}: no installed Python package {module!r} (install "
                               f"it, e.g. pip install {module.replace('_', '-')})")
    path = Path(next(iter(spec.submodule_search_locations))) / rel
    if not path.is_file():
        raise ModelSourceError(f"{source}: the package {module!r} has no file {rel!r} "
                               f"(looked in {path.parent})")
    return path


def gguf_file(source: str) -> Path | None:
    """The GGUF file a source names (a file, or a folder without config.json), else None."""
    if source.startswith(PACKAGE_PREFIX):
        path = package_file(source)
        return path if path.suffix == ".gguf" else None
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            raise ModelSourceError(f"{source}: {len(found)} GGUF files "
                                   f"({', '.join(p.name for p in found[:4])}); name one")
        return found[0] if found else None
    return None


def file_digest(path: Path) -> str:
    """SHA-256 of a file."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _convert(path: Path, out: Path, digest: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf_core.models.checkpoint import atomic_dir

    start = time.perf_counter()
    log.info("model: %s is GGUF: dequantizing it once into %s (a plain Hugging Face folder "
             "every stage loads)", path, out)
    with atomic_dir(out) as tmp:  # replaces an unfinished folder from a crash (no marker)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                      dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # dequantized: a plain float32 model now
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict(), strict=True)
        model.generation_config = loaded.generation_config
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / MARKER).write_text(json.dumps({"source": str(path), "sha256": digest,
                                              "bytes": path.stat().st_size}, indent=1))
    log.info("model: %s ready in %.0f s (%d parameters)", out.name,
             time.perf_counter() - start, sum(p.numel() for p in model.parameters()))


def cached_digest(folder: str | Path) -> str | None:
    """The SHA-256 of the GGUF file a cached folder was made from (None: not such a folder)."""
    marker = Path(folder) / MARKER
    return json.loads(marker.read_text())["sha256"] if marker.exists() else None


def resolve_model_source(source: str, cache: Path | None = None) -> str:
    """A model source -> what ``from_pretrained`` loads: a GGUF file becomes its float32 folder
    ``<cache>/<stem>-<sha256[:16]>``, made once under a file lock (``cache`` None:
    $RLHF_MODEL_CACHE, else ~/.cache/rlhf/models)."""
    path = gguf_file(source) if source else None
    if path is None:
        return str(package_file(source)) if source.startswith(PACKAGE_PREFIX) else source
    if cache is None:
        cache = Path(os.environ.get("RLHF_MODEL_CACHE", "~/.cache/rlhf/models")).expanduser()
    digest = file_digest(path)
    out = cache / f"{path.stem}-{digest[:16]}"
    if not (out / MARKER).exists():
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / f".{out.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (out / MARKER).exists():
                _convert(path, out, digest)
    return str(out)
