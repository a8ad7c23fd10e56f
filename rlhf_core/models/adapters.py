"""Stage outputs under LoRA (``model.lora``): only what the stage trained, plus
``rlhf_lora.json`` naming the ``kind`` and the ``base`` (with the first adapter's ``source``
and ``sha256`` to rebuild it); a chain of adapters loads as one merged model.
"""

from __future__ import annotations

import json
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rlhf_core.models.checkpoint import atomic_dir
from rlhf_core.models.models import ScalarHeadModel
from rlhf_core.models.sources import PACKAGE_PREFIX, resolve_model_source

META = "rlhf_lora.json"
EMBEDDINGS = "embeddings.safetensors"


def is_adapter_folder(path: str | Path) -> bool:
    return (Path(path) / META).is_file()


def base_of(folder: str | Path) -> str:
    """What an adapter folder adapts, for ``from_pretrained``: its ``base`` folder where it
    exists, else the ``source`` rebuilt (checked against ``sha256``), else the hub id."""
    folder = Path(folder)
    meta = json.loads((folder / META).read_text())
    base = meta["base"]
    path = Path(base) if Path(base).is_absolute() else folder / base
    if path.is_dir():
        return str(path)
    source = meta.get("source")
    if source:
        resolved = resolve_model_source(source)
        digest = meta.get("sha256")
        if digest and digest[:16] not in Path(resolved).name:
            raise ValueError(f"{folder}: its base {source!r} now has another digest than the "
                             f"adapter was trained on ({digest[:16]}...)")
        return resolved
    if base.startswith((".", "/")) or Path(base).suffix:
        raise FileNotFoundError(f"{folder}: its base model {base} is not here (and "
                                f"{META} names no source to rebuild it from)")
    return base  # a hub id


def _save_embeddings(model, base_rows: int, tmp: Path) -> None:
    """The embedding rows the vocabulary grew by, if any (the base's own rows stay frozen)."""
    if model.get_input_embeddings().num_embeddings == base_rows:
        return
    inp = model.get_input_embeddings().weight
    tensors = {"input": inp[base_rows:].detach().contiguous().cpu()}
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is not None and out.weight.data_ptr() != inp.data_ptr():
        tensors["output"] = out.weight[base_rows:].detach().contiguous().cpu()
    save_file(tensors, str(tmp / EMBEDDINGS), metadata={"base_rows": str(base_rows)})


def _load_embeddings(model, folder: Path) -> None:
    path = folder / EMBEDDINGS
    if not path.exists():
        return
    rows = model.get_input_embeddings().num_embeddings
    with safe_open(str(path), "pt") as f:  # the added rows and the base size, one read
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        saved = int((f.metadata() or {}).get("base_rows", rows))
    if saved != rows:
        raise ValueError(f"{path}: rows added to a {saved}-row vocabulary, but its base has "
                         f"{rows} rows: the adapter belongs to another base model")
    model.resize_token_embeddings(rows + tensors["input"].shape[0], mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[rows:].copy_(tensors["input"])
        if "output" in tensors:
            model.get_output_embeddings().weight[rows:].copy_(tensors["output"])


def _meta(kind: str, base: str | Path, source: dict | None) -> str:
    return json.dumps({"kind": kind, "base": str(base), **(source or {})}, indent=1)


def save_policy_adapter(peft_model, tokenizer, target: str | Path, base: str | Path,
                        base_rows: int, source: dict | None = None) -> Path:
    """Save a LoRA policy's adapter and tokenizer (``base_rows``: rows before any resize)."""
    with atomic_dir(target) as tmp:
        peft_model.save_pretrained(str(tmp), save_embedding_layers=False)
        tokenizer.save_pretrained(str(tmp))
        _save_embeddings(peft_model.get_base_model(), base_rows, tmp)
        (tmp / META).write_text(_meta("causal_lm", base, source))
    return Path(target)


def save_scalar_adapter(model: ScalarHeadModel, target: str | Path, base: str | Path) -> Path:
    """A scalar model whose trunk carries a LoRA adapter: the adapter and the head."""
    with atomic_dir(target) as tmp:
        model.backbone.save_pretrained(str(tmp), save_embedding_layers=False)
        model.save_head(tmp)
        (tmp / META).write_text(_meta("scalar", base, None))
    return Path(target)


def merge_adapter(model, folder: str | Path):
    """``model`` with the adapter folder's LoRA (and any rows it added) merged in."""
    from peft import PeftModel

    _load_embeddings(model, Path(folder))
    with peft_reading_old_names():
        return PeftModel.from_pretrained(model, str(folder)).merge_and_unload()


def bundle(folder: str | Path, target: str | Path) -> Path:
    """A self-contained copy of an adapter folder: adapter bases nested as ``base/``, the base
    model named by its source, or copied where it has none."""
    folder, target = Path(folder), Path(target)
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns(META, "README.md"))
    meta, base = json.loads((folder / META).read_text()), base_of(folder)
    source = meta.get("source") or ""  # portable: another machine rebuilds it from its name
    portable = bool(source) and (source.startswith(PACKAGE_PREFIX) or source.endswith(".gguf")
                                 or not (source.startswith((".", "/", "~"))
                                         or Path(source).expanduser().exists()))
    if is_adapter_folder(base):
        bundle(base, target / "base")
        meta["base"] = "base"
    elif portable:
        meta["base"] = meta["source"]  # rebuilt where it is loaded (base_of)
    elif Path(base).is_dir():
        shutil.copytree(base, target / "base")
        meta["base"] = "base"
    (target / META).write_text(json.dumps(meta, indent=1))
    return target


@contextmanager
def peft_reading_old_names():
    """Silence transformers' deprecation warning for peft's ``is_gradient_checkpointing``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        yield

