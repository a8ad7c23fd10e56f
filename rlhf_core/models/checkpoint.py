"""Atomic checkpoints (written into a temporary sibling, then renamed into place): weights as
safetensors, other state as plain tensors (``weights_only=True``); :class:`Checkpointer` lets an
interrupted stage continue bit for bit.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from rlhf_core.faults import crash_point

STATE_FILE = "state.pt"
META_FILE = "meta.json"


@contextmanager
def atomic_dir(target: str | Path, crash_label: str | None = None) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``target`` in one rename."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    old, tmp = target.with_name(f".{target.name}.old"), target.with_name(f".{target.name}.tmp")
    if not target.exists() and old.exists():  # a crash between the two renames below
        old.rename(target)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if crash_label:
        crash_point(f"checkpoint:{crash_label}")
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def save_policy(model, tokenizer, target: str | Path) -> Path:
    """save_pretrained (safetensors) of model and tokenizer, atomically."""
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return Path(target)


# -- RNG state as plain tensors and numbers (loadable with weights_only=True) ----------------
def capture_rng(generator: torch.Generator | None = None) -> dict:
    """torch (CPU and CUDA), numpy, python and the data-order generator's states."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def restore_rng(state: dict, generator: torch.Generator | None = None) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None and "generator" in state:
        generator.set_state(state["generator"])


def _partly_frozen(model: torch.nn.Module) -> bool:
    return any(not p.requires_grad for p in model.parameters())


def trained_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters training changes (a LoRA model's adapters and heads), each once."""
    return {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """A model's weights as safetensors: only the trained ones where some are frozen (LoRA)."""
    if not _partly_frozen(model):
        save_model(model, str(path))
        return
    save_file(trained_tensors(model), str(path))


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Inverse of :func:`save_weights`; a trained weight the file lacks is an error."""
    if not _partly_frozen(model):
        load_model(model, str(path))
        return
    tensors = load_file(str(path))
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    if trained - set(tensors) or set(tensors) - trained:
        raise ValueError(f"{path}: its weights do not match the model's trained ones "
                         f"(missing {sorted(trained - set(tensors))[:3]}, unexpected "
                         f"{sorted(set(tensors) - trained)[:3]})")
    model.load_state_dict(tensors, strict=False)


class Checkpointer:
    """Training-state checkpoints of one stage under ``root/step_XXXXXXXX``, the last
    ``keep_last`` kept; ``every`` = 0 disables it. ``on_saved(step, path)`` runs after each
    save."""

    def __init__(self, root: str | Path, models: dict[str, torch.nn.Module], every: int,
                 keep_last: int = 2, label: str = "stage"):
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1")
        self.root, self.models, self.every = Path(root), models, every
        self.keep_last, self.label = keep_last, label
        self.on_saved: Callable[[int, Path], None] | None = None

    def due(self, step: int, total: int) -> bool:
        """Save after this step? (Never after the last one: the stage's output follows.)"""
        return self.every > 0 and step % self.every == 0 and step < total

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first (temporary folders are ignored)."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob("step_*") if (p / META_FILE).exists())

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def save(self, step: int, optimizer, scheduler, generator: torch.Generator | None,
             extra: dict) -> Path:
        target = self.root / f"step_{step:08d}"
        with atomic_dir(target, crash_label=f"{self.label}:{step}") as tmp:
            for name, model in self.models.items():
                save_weights(model, tmp / f"{name}.safetensors")
            torch.save({"optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "rng": capture_rng(generator)}, tmp / STATE_FILE)
            (tmp / META_FILE).write_text(json.dumps({"step": step, "extra": extra}))
        for stale in self.checkpoints()[: -self.keep_last]:
            shutil.rmtree(stale, ignore_errors=True)
        if self.on_saved is not None:
            self.on_saved(step, target)
        return target

    def restore(self, optimizer, scheduler, generator: torch.Generator | None,
                lr: float | None = None) -> tuple[int, dict] | None:
        """Load the latest checkpoint in place -> (step, extra), or None; a new ``lr`` wins."""
        path = self.latest()
        if path is None:
            return None
        for name, model in self.models.items():
            load_weights(model, path / f"{name}.safetensors")
        state = torch.load(path / STATE_FILE, weights_only=True)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if lr is not None and any(lr != b for b in scheduler.base_lrs):
            scheduler.base_lrs = [lr] * len(scheduler.base_lrs)
            factors = [fn(scheduler.last_epoch) for fn in scheduler.lr_lambdas]
            for group, factor in zip(optimizer.param_groups, factors):
                group["initial_lr"], group["lr"] = lr, lr * factor
        restore_rng(state["rng"], generator)
        meta = json.loads((path / META_FILE).read_text())
        return meta["step"], meta["extra"]
