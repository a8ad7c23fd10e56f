"""PPO speed benchmark (docs/benchmarks.md): seconds per iteration (median
after warm-up), the rollout/update split, achieved TFLOP/s and the update's MFU against a
matmul peak measured in the same run (bf16 on CUDA, fp32 on CPU), and peak memory.

    python bench/ppo_bench.py --device cuda --precision bf16 --n-layer 24 --n-embd 1024 \\
        --batch 64 --max-new-tokens 128 --num-minibatches 4
    python bench/ppo_bench.py --threads 2          # 4 x 256, 32 x 48, CPU fp32

Models: one random GPT-2-shaped init (vocab 2048, head size 64) for policy and reference; a
fresh scalar head on it for reward model and critic. Untrained, so responses run to the token
budget (the update's worst case). Loaded through rlhf_core.models.loader like the pipeline.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.shapes import (  # noqa: E402
    add_shape_args,
    build_shape,
    forward_flops,
    matmul_peak,
    median,
    peak_memory_gb,
    real_shape,
)
from rlhf_core.config import LoraSettings, ModelConfig, OptimConfig, PPOConfig  # noqa: E402
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer, ppo_models  # noqa: E402
from rlhf_core.ppo.trainer import PPOTrainer  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_args(parser)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    parser.add_argument("--attn", default="sdpa", choices=["auto", "eager", "sdpa"])
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--micro-batch-size", type=int, default=None)
    parser.add_argument("--forward-batch-size", type=int, default=None)
    parser.add_argument("--generation-batch-size", type=int, default=None)
    parser.add_argument("--static-cache", action="store_true")
    parser.add_argument("--compile", action="store_true", help="torch.compile the update")
    parser.add_argument("--lora-r", type=int, default=0, help="LoRA rank (0: full training)")
    parser.add_argument("--profile", action="store_true",
                        help="after the timed iterations, profile one more update (CUDA): "
                        "its kernels' busy time against its wall time, the top kernels")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    return parser.parse_args(argv)


def build_trainer(args, tmp: Path):
    if args.model:
        folder, prompts, shape = real_shape(args.model, tmp)
        args.n_layer, args.n_embd, args.vocab = shape["n_layer"], shape["n_embd"], shape["vocab"]
        args.layer_params = shape["layer_params"]
    else:
        folder, prompts = build_shape(tmp, args.n_layer, args.n_embd, args.vocab,
                                      n_positions=64 + args.max_new_tokens, seed=args.seed)
        args.layer_params = None
    lora = LoraSettings(r=args.lora_r, alpha=2.0 * args.lora_r) if args.lora_r else None
    model_cfg = ModelConfig(device=args.device, precision=args.precision,
                            attn_implementation=args.attn,
                            gradient_checkpointing=args.gradient_checkpointing, lora=lora)
    device = torch.device(args.device)
    spec = LoadSpec.from_config(model_cfg, device)
    tok = load_tokenizer(folder, spec)
    load_pretrained(folder, LoadSpec(), "new_head").save(tmp / "rm")  # reward model = critic init
    models = ppo_models(folder, folder, tmp / "rm", tmp / "rm", spec)
    cfg = PPOConfig(iterations=args.warmup + args.iterations + args.profile,
                    rollout_batch_size=args.batch,
                    num_minibatches=args.num_minibatches, ppo_epochs=args.epochs,
                    max_new_tokens=args.max_new_tokens, optim=OptimConfig(lr=1e-6),
                    micro_batch_size=args.micro_batch_size,
                    forward_batch_size=args.forward_batch_size,
                    generation_batch_size=args.generation_batch_size,
                    static_cache=args.static_cache, compile=args.compile, checkpoint_every=0)
    trainer = PPOTrainer(models, tokenizer=tok, prompt_ids=prompts, cfg=cfg,
                         norm_stats={"mean": 0.0, "std": 1.0, "n": 1}, device=device,
                         generator=torch.Generator().manual_seed(args.seed),
                         precision=spec.precision)
    return trainer, spec


def iteration_flops(args, exp, recompute: bool) -> tuple[float, float]:
    """(rollout, update) model FLOPs of one iteration from its experience's shape."""
    B, T = exp.query_responses.shape
    R = exp.responses.shape[1]
    L, d, V = args.n_layer, args.n_embd, args.vocab
    policy_fwd = forward_flops(L, d, V, B, T, R + 1, args.layer_params)
    scalar_fwd = forward_flops(L, d, 0, B, T, 0, args.layer_params)
    # generate ~ one policy forward; + reference, value, reward (+ policy when recomputed)
    rollout = policy_fwd * (3 if recompute else 2) + 2 * scalar_fwd
    update = args.epochs * 3 * (policy_fwd + scalar_fwd)  # forward + backward (2x)
    return rollout, update


def profile_update(trainer) -> dict:
    """One more iteration with its update under torch.profiler: the GPU kernels' summed busy
    time against the update's wall time (a launch-bound update keeps the GPU idle between
    small kernels) and the ten kernels that take the most time."""
    import time

    from torch.profiler import ProfilerActivity, profile

    held, update = {}, trainer.update

    def profiled(exp):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            out = update(exp)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            held["wall"] = time.perf_counter() - start
        held["prof"] = prof
        return out

    trainer.update = profiled
    trainer.step()
    trainer.update = update
    kernel = torch.autograd.DeviceType.CUDA  # kernel rows only (operator rows repeat them)
    events = [e for e in held["prof"].key_averages() if e.device_type == kernel]

    def busy(e):
        return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))

    top = sorted(events, key=busy, reverse=True)[:10]
    return {"profile_update_wall_s": held["wall"],
            "profile_gpu_busy_s": sum(busy(e) for e in events) / 1e6,
            "profile_kernel_launches": sum(e.count for e in events),
            "profile_top_kernels": [[e.key[:80], round(busy(e) / 1e3, 1), e.count]
                                    for e in top]}


def main(argv=None) -> dict:
    args = parse_args(argv)
    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as tmp:
        trainer, spec = build_trainer(args, Path(tmp))
        n_params = sum(p.numel() for p in trainer.policy.parameters())
        rows, warmup = [], []
        for i in range(args.warmup + args.iterations):
            metrics, exp = trainer.step()
            if i < args.warmup:
                warmup.append(metrics["time/rollout_s"] + metrics["time/update_s"])
            else:
                flops = iteration_flops(args, exp, trainer.settings.recompute_logprobs)
                rows.append((metrics["time/rollout_s"], metrics["time/update_s"], *flops))
        profiled = profile_update(trainer) if args.profile else {}
    peak = matmul_peak(args.device)
    rollout, update = median([r[0] for r in rows]), median([r[1] for r in rows])
    total = median([r[0] + r[1] for r in rows])
    r_flops, u_flops = rows[-1][2], rows[-1][3]
    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "shape": args.model or f"{args.n_layer}x{args.n_embd}", "params": n_params,
        "precision": spec.precision, "batch": args.batch, "new_tokens": args.max_new_tokens,
        "minibatches": args.num_minibatches, "epochs": args.epochs,
        "gradient_checkpointing": args.gradient_checkpointing,
        "micro_batch_size": args.micro_batch_size, "lora_r": args.lora_r,
        "static_cache": args.static_cache, "compile": args.compile,
        "seconds_per_iteration": total, "all_iterations_s": [r[0] + r[1] for r in rows],
        "warmup_iterations_s": warmup,
        "rollout_s": rollout, "update_s": update, "rollout_fraction": rollout / total,
        "achieved_tflops": (r_flops + u_flops) / total / 1e12,
        "update_tflops": u_flops / update / 1e12,
        "matmul_peak_tflops": peak / 1e12,
        "update_mfu": u_flops / update / peak, "iteration_mfu": (r_flops + u_flops) / total / peak,
        "peak_gpu_memory_gb": peak_memory_gb(args.device),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        **profiled,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
