"""The alignment tax inside evaluate: what the base, SFT and PPO models lose on a probe and
held-out text (only with a pretrained ``model.base_model``), and the pretraining-mix text
(``data.pretrain``) that reduces it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from data_checks.tax_files import read_probe, read_text
from rlhf_core.config import TaxConfig
from rlhf_core.eval.tax import (
    MODELS,
    PROBE_FILE,
    TEXT_FILE,
    ProbeItem,
    answer_probe,
    bits_per_byte,
    is_right,
    tax_lost,
    tax_metrics,
    text_nats,
)
from rlhf_core.train.ptx import chunk_ids

NOT_APPLICABLE = "does not apply: no pretrained base (model.base_model) to lose anything"


def tax_inputs(tax: TaxConfig) -> tuple[list[ProbeItem], list[str]]:
    """The probe and held-out text the tax is measured on (read through the gate)."""
    probe = [ProbeItem(q, tuple(a), c) for q, a, c in read_probe(tax.probe or PROBE_FILE)]
    return probe, read_text(tax.text or TEXT_FILE)


def applies(cfg) -> bool:
    return cfg.eval.tax.enabled and bool(cfg.model.base_model)


def pretrain_chunks(cfg, tokenizer, section: str) -> list[list[int]] | None:
    """The ``section`` stage's pretraining mix: rows tokenized with EOS, cut into
    ``ptx_max_tokens`` chunks; None when the mix is off."""
    mix = getattr(cfg, section)
    if mix.ptx_coef <= 0:
        return None
    rows = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            for text in read_text(cfg.data.pretrain.path, "data.pretrain")]
    return chunk_ids(rows, mix.ptx_max_tokens)


def check_tax_inputs(cfg) -> None:
    """Read the tax and pretraining-mix inputs the run uses through the gate (DataError)."""
    if applies(cfg):
        tax_inputs(cfg.eval.tax)
    if cfg.sft.ptx_coef > 0 or cfg.ppo.ptx_coef > 0:
        read_text(cfg.data.pretrain.path, "data.pretrain")


def _cached(folder: Path, key: dict, compute) -> tuple[list[str], float]:
    """The base's answers and bits per byte, cached in ``folder`` by a digest of their inputs."""
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    path = folder / "tax" / f"{name}.json"
    if path.exists():
        kept = json.loads(path.read_text(encoding="utf-8"))
        return kept["answers"], kept["bpb"]
    answers, bpb = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"answers": answers, "bpb": bpb}), encoding="utf-8")
    tmp.replace(path)
    return answers, bpb


def measure(tax: TaxConfig, probe: list[ProbeItem], text: list[str], models: dict, tokenizer,
            progress=None, base_cache: tuple[Path, dict] | None = None
            ) -> tuple[dict, list[dict]]:
    """``models`` (name -> frozen causal LM) -> ``eval/tax/*`` metrics and the probe's
    side-by-side rows; ``base_cache``: (folder, key) to reuse the base's figures."""
    rows = [{"question": it.question, "expected": " | ".join(it.answers),
             "category": it.category} for it in probe]
    right, bpb = {}, {}
    for k, (name, model) in enumerate(models.items()):
        done = k * len(probe)
        step = None if progress is None else (lambda n, done=done: progress(done + n))

        def compute(model=model, step=step) -> tuple[list[str], float]:
            answers = answer_probe(model, tokenizer, probe, system=tax.system,
                                   max_new_tokens=tax.max_new_tokens, on_batch=step)
            return answers, bits_per_byte(*text_nats(model, tokenizer, text))

        if name == "base" and base_cache is not None:
            key = {**base_cache[1], "probe": [[it.question, it.answers] for it in probe],
                   "text": text, "system": tax.system, "max_new_tokens": tax.max_new_tokens}
            answers, bpb[name] = _cached(base_cache[0], key, compute)
        else:
            answers, bpb[name] = compute()
        right[name] = [is_right(a, it.answers) for a, it in zip(answers, probe)]
        for row, answer, ok in zip(rows, answers, right[name]):
            row[f"{name}_answer"], row[f"{name}_right"] = answer, ok
    return tax_metrics(right, bpb), rows


def base_cache(prep, spec, device) -> tuple[Path, dict] | None:
    """(folder, key) caching the base's tax figures, for a base known by digest; None: the
    base is measured each run."""
    digest = (prep.base_source or {}).get("sha256")
    if not digest:
        return None
    import torch

    return Path(prep.base_model), {"base": digest, "precision": spec.precision,
                                   "device": str(device), "torch": torch.__version__}


def summary_line(metrics: dict, budget: float | None = None) -> str:
    """The run summary's tax line; a tax not measured is said so, never shown as 0."""
    if "eval/tax/probe_acc_policy" not in metrics:
        return f"alignment tax: {NOT_APPLICABLE}"
    names = [n for n in MODELS if f"eval/tax/probe_acc_{n}" in metrics]
    acc = ", ".join(f"{n} {metrics[f'eval/tax/probe_acc_{n}']:.3f}" for n in names)
    bpb = ", ".join(f"{n} {metrics[f'eval/tax/bpb_{n}']:.3f}" for n in names
                    if f"eval/tax/bpb_{n}" in metrics)
    line = f"alignment tax: probe accuracy {acc}" + (f"; bits per byte {bpb}" if bpb else "")
    lost = tax_lost(metrics)
    if lost is not None:
        d, lo, hi = (metrics[f"eval/tax/probe_diff_policy_base{k}"] for k in ("", "_low", "_high"))
        line += f"; policy vs base {d:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        if budget is not None:
            line += f" ({'over' if lost > budget else 'within'} the budget of {budget:.2f})"
    return line


def over_budget(metrics: dict, budget: float) -> str | None:
    """Why the policy is over its tax budget, or None (within it, or no base measured)."""
    lost = tax_lost(metrics)
    if lost is None or lost <= budget:
        return None
    return (f"its alignment tax is over budget: probe accuracy "
            f"{metrics['eval/tax/probe_acc_policy']:.3f} against the base model's "
            f"{metrics['eval/tax/probe_acc_base']:.3f} (lost {lost:.3f}, more than "
            f"eval.tax.budget {budget:.2f})")

