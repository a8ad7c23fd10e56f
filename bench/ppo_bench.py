"""PPO speed benchmark (SPEC "Where PPO time goes"): seconds per iteration, rollout/update
split, tokens/s, peak RSS and achieved FLOP/s against a matmul peak measured in the same run.

    python bench/ppo_bench.py [--iterations 5] [--n-embd 64] [--n-layer 2] [--batch 32]

Models are the demo's tiny GPT-2 built in a temporary folder (no training beforehand, so
responses run to the token budget: the worst case for the update).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from rlhf_core.config import OptimConfig, PPOConfig
from rlhf_core.data import encode
from rlhf_core.demo import DemoSizes, build_demo_assets
from rlhf_core.models import ScalarHeadModel, load_causal_lm, load_tokenizer
from rlhf_core.ppo import PPOTrainer


def matmul_peak_flops(n: int = 512, repeat: int = 20) -> float:
    """FLOP/s of a float32 n x n matmul on this machine, now."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(repeat):
        a @ b
    return 2 * n**3 * repeat / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        assets = build_demo_assets(Path(tmp), sizes=DemoSizes(n_sft=64, n_pref=64, n_prompts=256,
                                                               n_eval=16, n_pref_eval=16),
                                   n_layer=args.n_layer, n_embd=args.n_embd,
                                   n_head=max(1, args.n_embd // 16))
        tok = load_tokenizer(str(assets["base_model"]))
        policy, ref = (load_causal_lm(assets["base_model"]) for _ in range(2))
        value, reward = (ScalarHeadModel.from_causal_lm(assets["base_model"]) for _ in range(2))
        prompts = [encode(tok, json.loads(line)["prompt"])
                   for line in Path(assets["prompts"]).read_text().splitlines()]
        cfg = PPOConfig(iterations=args.iterations, rollout_batch_size=args.batch,
                        num_minibatches=2, ppo_epochs=4, max_new_tokens=args.max_new_tokens,
                        optim=OptimConfig(lr=1e-4))
        trainer = PPOTrainer(policy, ref, value, reward, tok, prompts, cfg,
                             {"mean": 0.0, "std": 1.0, "n": 1}, torch.device("cpu"),
                             torch.Generator().manual_seed(0))
        n_params = sum(p.numel() for p in policy.parameters())
        rows = []
        for _ in range(args.iterations):
            metrics, exp = trainer.step()
            tokens = float(exp.query_responses.numel())
            # forward ~2N FLOPs/token, backward ~4N: rollout = 3 forwards of ~N-sized models
            # (ref, value, reward; generation counted once), update = K*(policy+value) fwd+bwd
            flops = 2 * n_params * tokens * 4 + 6 * n_params * tokens * cfg.ppo_epochs * 2
            rows.append((metrics["time/rollout_s"], metrics["time/update_s"],
                         metrics["throughput/tokens_per_s"], flops))
    peak = matmul_peak_flops()
    rollout = sum(r[0] for r in rows) / len(rows)
    update = sum(r[1] for r in rows) / len(rows)
    flops = sum(r[3] for r in rows) / len(rows)
    print(json.dumps({
        "params": n_params, "seconds_per_iteration": rollout + update,
        "rollout_s": rollout, "update_s": update,
        "rollout_fraction": rollout / (rollout + update),
        "tokens_per_s": sum(r[2] for r in rows) / len(rows),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "achieved_flops": flops / (rollout + update), "matmul_peak_flops": peak,
    }, indent=2))


if __name__ == "__main__":
    main()
