"""The alignment tax (README § Sources [InstructGPT]) of the base, SFT and PPO models: greedy
accuracy on checkable questions and bits per byte of English text (defaults in ``tax_data/``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from rlhf_core.eval.gate import paired_bootstrap_ci
from rlhf_core.train.ptx import next_token_logp, padded_lm_forward

DATA = Path(__file__).with_name("tax_data")
PROBE_FILE = DATA / "probe.jsonl"
TEXT_FILE = DATA / "general.txt"
MODELS = ("base", "sft", "policy")
# the pairs whose paired differences are reported: (later, earlier)
PAIRS = (("sft", "base"), ("policy", "base"), ("policy", "sft"))


@dataclass(frozen=True)
class ProbeItem:
    """One probe question and the answers that count as right."""

    question: str
    answers: tuple[str, ...]
    category: str = ""


@lru_cache(maxsize=256)
def _answer_pattern(answer: str) -> re.Pattern:
    # a whole word or phrase ("7" is not in "17"), a word's plural allowed
    plural = "(?:s|es)?" if answer[-1:].isalpha() else ""
    return re.compile(r"(?<![0-9a-z])" + re.escape(answer.lower()) + plural + r"(?![0-9a-z])")


def is_right(answer: str, accepted: Sequence[str]) -> bool:
    """Whether ``answer`` contains one of ``accepted`` as a whole word or phrase."""
    text = answer.lower()
    return any(_answer_pattern(a).search(text) for a in accepted if a.strip())


def probe_prompt(question: str, chat: bool, system: str | None = None) -> str | list[dict]:
    """A probe question as asked: a conversation for a chat model, else a plain Q/A frame."""
    if not chat:
        return f"Question: {question}\nAnswer:"
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": question}]


@torch.inference_mode()
def answer_probe(model, tokenizer, items: Sequence[ProbeItem], *, system: str | None = None,
                 max_new_tokens: int = 32, batch_size: int = 32,
                 on_batch=None) -> list[str]:
    """Each probe question answered greedily -> the answers' text, in order."""
    from rlhf_core.eval.serving import GenerationSettings, answer_rows, stop_ids

    chat = bool(getattr(tokenizer, "chat_template", None))
    settings = GenerationSettings(max_new_tokens=max_new_tokens, do_sample=False)
    stop, answers = stop_ids(model, tokenizer), []
    for start in range(0, len(items), batch_size):
        chunk = items[start: start + batch_size]
        prompts = [probe_prompt(it.question, chat, system) for it in chunk]
        for answer in answer_rows(model, tokenizer, prompts, settings, stop):
            answers.append((answer["content"] if isinstance(answer, dict) else answer).strip())
        if on_batch is not None:
            on_batch(len(answers))
    return answers


@torch.inference_mode()
def text_nats(model, tokenizer, texts: Sequence[str], max_tokens: int = 512,
              batch_size: int = 8) -> tuple[float, int]:
    """Summed NLL of every token of ``texts``, each scored on its own after a BOS (else EOS)
    separator and cut to ``max_tokens`` -> (nats, bytes of the scored text)."""
    sep = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else sep
    device = next(model.parameters()).device
    limit = getattr(model.config, "max_position_embeddings", None) or \
        getattr(model.config, "n_positions", None)
    max_tokens = min(max_tokens, limit - 1) if limit else max_tokens  # the separator's place
    nats, n_bytes = 0.0, 0
    for start in range(0, len(texts), batch_size):
        seqs = []
        for text in texts[start: start + batch_size]:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
            n_bytes += len(tokenizer.decode(ids).encode("utf-8"))
            seqs.append([sep, *ids])
        logits, ids, mask = padded_lm_forward(model, seqs, pad, device)
        nats -= float((next_token_logp(logits, ids) * mask[:, 1:]).sum())
    return nats, n_bytes


def bits_per_byte(nats: float, n_bytes: int) -> float:
    """Negative log-likelihood in nats over a text of ``n_bytes`` bytes -> bits per byte."""
    if n_bytes <= 0:
        raise ValueError("bits_per_byte: no text to score")
    return nats / (math.log(2) * n_bytes)


def tax_metrics(right: dict[str, Sequence[bool]], bpb: dict[str, float],
                confidence: float = 0.95) -> dict[str, float]:
    """Per-model probe accuracy and bits per byte, with paired differences -> ``eval/tax/*``.
    ``right``: per model, one bool per probe question, in one order."""
    out: dict[str, float] = {}
    for name, marks in right.items():
        if not marks:
            raise ValueError(f"tax_metrics: no probe answers for {name}")
        out[f"eval/tax/probe_acc_{name}"] = sum(marks) / len(marks)
    for name, value in bpb.items():
        out[f"eval/tax/bpb_{name}"] = value
    for later, earlier in PAIRS:
        if later in right and earlier in right:
            diffs = [float(a) - float(b) for a, b in zip(right[later], right[earlier], strict=True)]
            mean, low, high = paired_bootstrap_ci(diffs, confidence)
            key = f"eval/tax/probe_diff_{later}_{earlier}"
            out.update({key: mean, f"{key}_low": low, f"{key}_high": high})
        if later in bpb and earlier in bpb:
            out[f"eval/tax/bpb_diff_{later}_{earlier}"] = bpb[later] - bpb[earlier]
    return out


def tax_lost(metrics: dict[str, float]) -> float | None:
    """Probe accuracy the policy lost against the base model, or None without a base."""
    base, policy = metrics.get("eval/tax/probe_acc_base"), metrics.get("eval/tax/probe_acc_policy")
    return None if base is None or policy is None else base - policy
