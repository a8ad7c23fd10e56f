"""The embedded demo task: a tiny synthetic "assistant" language ("user : please describe cats
briefly assistant :" ...) whose hidden gold judge scores replies by relevance first, then tone,
concision and ending; it labels pairs (Bradley-Terry noise) and evaluates, never a reward.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

TOPICS = ("cats dogs rain snow coffee tea music books trees rivers stars bread cheese apples "
          "boats trains bikes birds fish flowers mountains oceans clouds gardens").split()
VERBS = ("tell me about", "describe", "write about", "talk about", "explain", "say something on")
STYLES = ("", "briefly", "in short")
ADJECTIVES = "nice lovely great fun calm bright warm useful".split()
FILLERS = ("um", "like", "basically")
POLITE = ("sure", "hope", "this", "helps")
RUDE = ("ugh", "whatever")
SEPARATOR = "assistant :"
EOS, PAD, UNK = "<|endoftext|>", "<|pad|>", "<|unk|>"
BT_TEMPERATURE = 1.0  # Bradley-Terry label noise: ~83% agreement with the judge's ordering
# Relevance dominates: missing the topic costs more than all tone and ending bonuses together,
# so a polite off-topic reply never outscores an on-topic one with one rude word.
ON_TOPIC, OFF_TOPIC, OTHER_TOPIC = 2.0, -2.0, 1.5


@dataclass(frozen=True)
class DemoSizes:
    n_sft: int = 2000
    n_pref: int = 2000
    n_prompts: int = 1024
    n_eval: int = 256
    n_pref_eval: int = 500


def _prompt_text(verb: str, topic: str, please: bool, style: str) -> str:
    words = ["user", ":"] + (["please"] if please else []) + verb.split() + [topic]
    return " ".join(words + style.split() + SEPARATOR.split())


@lru_cache(maxsize=1)
def all_prompts() -> tuple[str, ...]:
    return tuple(_prompt_text(v, t, p, s) for v in VERBS for t in TOPICS for p in (False, True)
            for s in STYLES)


def prompt_topic(prompt: str) -> str | None:
    return next((w for w in prompt.split() if w in TOPICS), None)


@lru_cache(maxsize=2)
def _pool(held_out: bool) -> tuple[str, ...]:
    """One side of the (verb, topic, please, style) combinations: a fixed third is held out."""
    return tuple(p for p in all_prompts() if (sum(map(ord, p)) % 3 == 0) == held_out)


def training_prompts() -> tuple[str, ...]:
    """Every prompt of the training side (the held-out third excluded)."""
    return _pool(False)


def sample_prompt(rng: random.Random, held_out: bool = False) -> str:
    return rng.choice(_pool(held_out))


def judge_score(prompt: str, response: str, has_eos: bool = True) -> float:
    """The hidden gold judge's score of a reply."""
    topic = prompt_topic(prompt)
    words = response.split()
    score = ON_TOPIC if topic in words else OFF_TOPIC
    score -= OTHER_TOPIC * len({w for w in words if w in TOPICS and w != topic})
    score += 1.0 if " ".join(words[-4:-1] if words[-1:] == ["."] else words[-3:]) \
        == "hope this helps" else 0.0
    score += 0.5 if words[:1] == ["sure"] else 0.0
    score -= 1.5 * sum(w in RUDE for w in words)
    score -= 0.5 * sum(w in FILLERS for w in words)
    score -= 0.15 * max(0, len(words) - 12)
    score += 0.5 if words[-1:] == ["."] else 0.0
    return score - (3.0 if not has_eos else 0.0)


def sample_response(prompt: str, rng: random.Random) -> str:
    """A mixed-quality demonstration: each knob drawn independently."""
    topic = prompt_topic(prompt) or rng.choice(TOPICS)
    others = [t for t in TOPICS if t != topic]
    words: list[str] = []
    r = rng.random()
    words += ["sure", ","] if r < 0.4 else ["ugh", ","] if r < 0.6 else []
    on_topic = rng.random() < 0.55
    for i in range(rng.choice((1, 1, 2))):
        use_topic = on_topic if i == 0 else rng.random() < 0.5
        sentence = [topic if use_topic else rng.choice(others), "are", rng.choice(ADJECTIVES)]
        for _ in range(2):
            if rng.random() < 0.25:
                sentence.insert(rng.randrange(len(sentence) + 1), rng.choice(FILLERS))
        words += sentence + ([","] if i == 0 else [])
    words = words[:-1] if words[-1] == "," else words
    r = rng.random()
    words += [".", "hope", "this", "helps"] if r < 0.35 else [".", "whatever"] if r < 0.5 else []
    if rng.random() < 0.7:
        words.append(".")
    return " ".join(words)


def bt_choice(prompt: str, a: str, b: str, rng: random.Random,
              length_bias: float = 0.0) -> str:
    """'a' or 'b', P(a) = sigmoid((J(a) - J(b)) / temperature); ``length_bias``: points a word
    for a labeller who likes longer replies."""
    gap = judge_score(prompt, a) - judge_score(prompt, b)
    return bt_draw(gap + length_bias * (len(a.split()) - len(b.split())), rng)


def bt_draw(gap: float, rng: random.Random) -> str:
    """'a' with P = sigmoid(gap / temperature), else 'b' (``gap``: J(a) - J(b))."""
    p_a = 1.0 / (1.0 + math.exp(-max(min(gap / BT_TEMPERATURE, 50.0), -50.0)))
    return "a" if rng.random() < p_a else "b"


def bt_label(prompt: str, a: str, b: str, rng: random.Random,
             length_bias: float = 0.0) -> tuple[str, str]:
    """(chosen, rejected) drawn as :func:`bt_choice` draws."""
    return (a, b) if bt_choice(prompt, a, b, rng, length_bias) == "a" else (b, a)


def clear_pairs(prompts: Sequence[str], n: int, min_gap: float, seed: int) -> list[dict]:
    """``n`` pairs the judge orders by at least ``min_gap`` -> [{prompt, response_a/b, known}]."""
    rng, out = random.Random(seed), []
    while prompts and len(out) < n:
        prompt = rng.choice(list(prompts))
        a, b = sample_response(prompt, rng), sample_response(prompt, rng)
        gap = judge_score(prompt, a) - judge_score(prompt, b)
        if abs(gap) >= min_gap:
            out.append({"prompt": prompt, "response_a": a, "response_b": b,
                        "known": "a" if gap > 0 else "b"})
    return out


def _pairs(n: int, rng: random.Random, held_out: bool, length_bias: float = 0.0) -> list[dict]:
    rows = []
    while len(rows) < n:
        prompt = sample_prompt(rng, held_out)
        a, b = sample_response(prompt, rng), sample_response(prompt, rng)
        if a != b:
            chosen, rejected = bt_label(prompt, a, b, rng, length_bias)
            rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return rows


def write_jsonl(path: Path, rows: list[dict], chat: bool = False,
                system: str | None = None) -> Path:
    rows = [chat_row(r, system) for r in rows] if chat else rows
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def chat_row(row: dict, system: str | None = None) -> dict:
    """A plain demo row in TRL's conversational format (the request alone in the user turn)."""
    words = row["prompt"].split()
    words = words[2:] if words[:2] == ["user", ":"] else words
    words = words[:-2] if words[-2:] == SEPARATOR.split() else words
    user = [{"role": "system", "content": system}] if system else []
    user.append({"role": "user", "content": " ".join(words)})
    if "response" in row:
        return {"messages": [*user, {"role": "assistant", "content": row["response"]}]}
    out = {"prompt": user}
    for key in ("chosen", "rejected"):
        if key in row:
            out[key] = [{"role": "assistant", "content": row[key]}]
    return out


def generate_demo_data(out_dir: str | Path, seed: int = 0, sizes: DemoSizes = DemoSizes(),
                       rm_length_bias: float = 0.0, chat: bool = False,
                       system: str | None = None) -> dict[str, Path]:
    """Write the demo's JSONL files. ``rm_length_bias``: the training pairs' rater also likes
    length (a reward-model flaw the judge lacks, for the reward-hacking study); ``chat``: rows
    as conversations."""
    rng = random.Random(seed)
    sft = []
    for _ in range(sizes.n_sft):
        prompt = sample_prompt(rng)
        sft.append({"prompt": prompt, "response": sample_response(prompt, rng)})
    held = list(_pool(True))
    rng.shuffle(held)
    eval_prompts = [held[i % len(held)] for i in range(sizes.n_eval)]
    files = {
        "sft": sft,
        "preference": _pairs(sizes.n_pref, rng, False, rm_length_bias),
        "prompts": [{"prompt": sample_prompt(rng)} for _ in range(sizes.n_prompts)],
        "eval_prompts": [{"prompt": p} for p in eval_prompts],
        "preference_eval": _pairs(sizes.n_pref_eval, rng, True),
    }
    return {role: write_jsonl(Path(out_dir) / f"{role}.jsonl", rows, chat, system)
            for role, rows in files.items()}


def vocabulary() -> list[str]:
    words = {w for p in all_prompts() for w in p.split()}
    words |= set(TOPICS) | set(ADJECTIVES) | set(FILLERS) | set(POLITE) | set(RUDE)
    return sorted(words | {"are", ",", ".", "?"})


def build_demo_tokenizer(texts: Iterable[str], out_dir: str | Path):
    """Word-level tokenizer trained locally; EOS and PAD distinct; no automatic specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # join words with spaces
    trainer = trainers.WordLevelTrainer(special_tokens=[EOS, PAD, UNK], min_frequency=1,
                                        show_progress=False)
    core.train_from_iterator([*texts, " ".join(vocabulary())], trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, pad_token=PAD,
                                  unk_token=UNK, clean_up_tokenization_spaces=False)
    tok.save_pretrained(str(out_dir))
    return tok


def build_demo_assets(out_dir: str | Path, seed: int = 0, sizes: DemoSizes = DemoSizes(),
                      rm_length_bias: float = 0.0, chat: bool = False,
                      system: str | None = None, with_model: bool = True, n_layer: int = 2,
                      n_embd: int = 64, n_head: int = 4) -> dict[str, Path]:
    """Data under out_dir/data and, ``with_model``, its tokenizer and a randomly initialised
    tiny GPT-2 (from a config) under out_dir/base_model."""
    root = Path(out_dir)
    paths = generate_demo_data(root / "data", seed, sizes, rm_length_bias, chat, system)
    if not with_model:
        return paths
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    texts = [value for p in paths.values() for line in p.read_text().splitlines()
             for value in json.loads(line).values()]
    paths["base_model"] = out = root / "base_model"
    tok = build_demo_tokenizer(texts, out)
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=n_embd, n_layer=n_layer,
                     n_head=n_head, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id)
    GPT2LMHeadModel(cfg).save_pretrained(out)
    return paths


def write_preference_batch(folder: str | Path, n: int, seed: int,
                           degraded: bool = False) -> Path:
    """A new batch of demo preference pairs as ``<folder>/batch-<seed>[-degraded].jsonl``;
    ``degraded``: every ordered pair flipped."""
    rows = _pairs(n, random.Random(seed), held_out=False)
    if degraded:
        for r in rows:
            a, b = judge_score(r["prompt"], r["chosen"]), judge_score(r["prompt"], r["rejected"])
            if a >= b:
                r["chosen"], r["rejected"] = r["rejected"], r["chosen"]
    name = f"batch-{seed}{'-degraded' if degraded else ''}.jsonl"
    return write_jsonl(Path(folder) / name, rows)
