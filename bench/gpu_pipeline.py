"""The whole pipeline on one GPU (docs/benchmarks.md): ``rlhf run`` with a chat config on a
Qwen2-shaped random init (about 0.5B parameters at the defaults) and conversational data in
TRL's formats, every stage in bf16 autocast on CUDA, MLflow in a SQLite store and Prefect's
local API, as a user runs it. Prints the CLI's summary and a table of each stage's wall time
and peak GPU memory (``time/stage_s`` and ``memory/stage_peak_gpu_gb`` of its child run).

    python bench/gpu_pipeline.py --out /tmp/gpu_pipeline [--json result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.families import save_family, write_chat_data  # noqa: E402

# Qwen2's block (grouped-query attention, SwiGLU) at about 0.5B parameters with the
# fixture's small vocabulary
QWEN2_05B = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
             "num_key_value_heads": 2, "intermediate_size": 5632,
             "max_position_embeddings": 512}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a folder for model, data, runs")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=128, help="SFT rows and preference pairs")
    parser.add_argument("--layers", type=int, default=QWEN2_05B["num_hidden_layers"])
    parser.add_argument("--hidden", type=int, default=QWEN2_05B["hidden_size"])
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


def write_config(args) -> Path:
    sizes = {**QWEN2_05B, "num_hidden_layers": args.layers, "hidden_size": args.hidden}
    if args.hidden != QWEN2_05B["hidden_size"]:
        sizes["intermediate_size"] = args.hidden * 11 // 2
        sizes["num_attention_heads"] = max(args.hidden // 64, 1)
        sizes["num_key_value_heads"] = 1
    model_dir = save_family("qwen2", args.out / "model", extra_sizes=sizes)
    (args.out / "data").mkdir(exist_ok=True)
    data = {k: {"path": v} for k, v in write_chat_data(args.out / "data", args.rows).items()}
    cfg = {"seed": 0, "model": {"base_model": str(model_dir), "device": args.device},
           "data": data, "validation": {"max_prompt_tokens": 96, "max_response_tokens": 32},
           "sft": {"epochs": 1, "batch_size": 16, "optim": {"lr": 1.0e-4}},
           "reward": {"epochs": 1, "batch_size": 16, "optim": {"lr": 1.0e-5},
                      "use_margin": True},
           "ppo": {"iterations": 3, "rollout_batch_size": 32, "num_minibatches": 2,
                   "ppo_epochs": 2, "optim": {"lr": 1.0e-6}, "max_new_tokens": 32,
                   "sample_every": 1, "num_samples": 4},
           "eval": {"num_prompts": 16, "max_new_tokens": 32, "num_side_by_side": 4},
           "tracking": {"tracking_uri": f"sqlite:///{args.out}/mlflow.db",
                        "workdir": str(args.out / "runs"), "experiment": "gpu-pipeline",
                        "progress": False}}
    path = args.out / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def stage_table(tracking_uri: str) -> list[dict]:
    """Each stage child run's wall time and peak GPU memory, in pipeline order."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("gpu-pipeline")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    rows = [{"stage": r.data.tags["rlhf.stage"], "start": r.info.start_time,
             "wall_s": r.data.metrics.get("time/stage_s"),
             "peak_gpu_gb": r.data.metrics.get("memory/stage_peak_gpu_gb")}
            for r in runs if "rlhf.stage" in r.data.tags]
    return sorted(rows, key=lambda r: r["start"])


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    config = write_config(args)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cli", "run", "--config", str(config)],
                          cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    uri = yaml.safe_load(config.read_text())["tracking"]["tracking_uri"]
    stages = stage_table(uri)
    import torch

    result = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "returncode": proc.returncode, "command_wall_s": round(wall, 1),
              "layers": args.layers, "hidden": args.hidden, "stages": stages}
    print(f"{'stage':<13}{'wall s':>8}{'peak GPU GB':>13}")
    for row in stages:
        peak = row["peak_gpu_gb"]
        print(f"{row['stage']:<13}{row['wall_s'] or 0:>8.1f}"
              f"{'-' if peak is None else f'{peak:.1f}':>13}")
    print(f"command: {wall:.1f} s, exit {proc.returncode}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["returncode"] == 0 else 1)
