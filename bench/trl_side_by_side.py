"""TRL 1.12's PPOTrainer (``trl.experimental.ppo``, its last release with PPO) on the same
shapes, prompt tokens, batch and PPO settings as bench/ppo_bench.py, so anyone can re-check
the ratio. Needs the optional extra: ``pip install -e '.[bench]'`` (trl==1.12.0).

    python bench/trl_side_by_side.py --device cuda --n-layer 24 --n-embd 1024 \\
        --batch 64 --max-new-tokens 128 --num-minibatches 4
    python bench/ppo_bench.py        --device cuda --n-layer 24 --n-embd 1024 \\
        --batch 64 --max-new-tokens 128 --num-minibatches 4 --precision bf16

Prints seconds per iteration (median after warm-up, between TRL's on_step_end callbacks with
a device sync) and peak GPU memory. TRL runs fp32 unless --precision bf16 (its own autocast).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.shapes import (  # noqa: E402
    add_shape_args,
    build_shape,
    median,
    peak_memory_gb,
    real_shape,
    sync,
)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_args(parser)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--lora-r", type=int, default=0, help="LoRA rank of the policy (TRL "
                        "adapts the policy only; its reference is the policy with the adapter "
                        "off); 0: full training")
    args = parser.parse_args(argv)
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        TrainerCallback,
    )
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    hf_logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    stamps: list[float] = []

    class Timer(TrainerCallback):
        def on_train_begin(self, *a, **k):
            sync(args.device)
            stamps.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            sync(args.device)
            stamps.append(time.perf_counter())

    n_iter = args.warmup + args.iterations
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            folder, prompts, _ = real_shape(args.model, Path(tmp))
        else:
            folder, prompts = build_shape(Path(tmp), args.n_layer, args.n_embd, args.vocab,
                                          n_positions=64 + args.max_new_tokens, seed=args.seed)
        tok = AutoTokenizer.from_pretrained(folder)
        tok.padding_side = "left"
        policy = AutoModelForCausalLM.from_pretrained(folder)
        ref = None if args.lora_r else AutoModelForCausalLM.from_pretrained(folder)
        peft = None
        if args.lora_r:
            from peft import LoraConfig

            peft = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r,
                              target_modules="all-linear", task_type="CAUSAL_LM")
        torch.manual_seed(args.seed)
        value, reward = (AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1)
                         for _ in range(2))
        reward.load_state_dict(value.state_dict())  # critic init = reward model, as ours
        data = Dataset.from_dict({"input_ids": (prompts * n_iter)[: args.batch * n_iter]})
        cfg = PPOConfig(
            output_dir=str(Path(tmp) / "out"), per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=1, num_mini_batches=args.num_minibatches,
            num_ppo_epochs=args.epochs, total_episodes=args.batch * n_iter,
            response_length=args.max_new_tokens, temperature=0.7, stop_token="eos",
            missing_eos_penalty=1.0, kl_coef=0.05, learning_rate=1e-6,
            local_rollout_forward_batch_size=args.batch, num_sample_generations=0,
            report_to=[], save_strategy="no", logging_steps=10**6, seed=args.seed,
            bf16=args.precision == "bf16", fp16=False, use_cpu=args.device == "cpu",
            dataloader_num_workers=0, disable_tqdm=True,
        )
        trainer = PPOTrainer(args=cfg, processing_class=tok, model=policy, ref_model=ref,
                             reward_model=reward, train_dataset=data, value_model=value,
                             callbacks=[Timer()], peft_config=peft)
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
    times = [b - a for a, b in zip(stamps, stamps[1:])][args.warmup:]
    import trl

    result = {"trainer": f"trl {trl.__version__}",
              "shape": args.model or f"{args.n_layer}x{args.n_embd}",
              "precision": args.precision, "batch": args.batch,
              "new_tokens": args.max_new_tokens, "minibatches": args.num_minibatches,
              "epochs": args.epochs, "lora_r": args.lora_r,
              "seconds_per_iteration": median(times),
              "all_iterations_s": times, "peak_gpu_memory_gb": peak_memory_gb(args.device)}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
