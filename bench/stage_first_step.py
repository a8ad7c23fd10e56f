"""Each training stage's time to its first step at real sizes (issue 37): SFT, the reward model
and PPO, each in a fresh process, from the process's start and from the stage body's start to
its first optimizer step (PPO: its first iteration), with the process's peak memory.

    python bench/stage_first_step.py prepare --pairs 20000
    python bench/stage_first_step.py time --pairs 20000 --label after
    /work/main/.venv/bin/python bench/stage_first_step.py time --pairs 20000 \\
        --tree /work/main --label before      # the same stages from another source tree

``prepare`` takes the data bench/data_scale.py generates (``--workdir``, default
/tmp/rlhf-data-scale; generated there at that size when missing) and writes what the gate
leaves for the stages under ``<stages-dir>/pairs_<N>_seed<S>`` (``--stages-dir``, default
/tmp/rlhf-stage-first-step): the cleaned files (the rows within the length budget of
bench/data_scale.py's config, no other check: the gate's own timings are bench/data_scale.py's),
each with its token file (data_checks/tokens.py, from one batched tokenizer pass), the
tokenizer with the PAD the gate adds, and a reward model and critic made from the base model
for PPO. ``time`` runs each stage body (under the tests' stage context, tests/fake_stage.py:
no Prefect, no tracking server) from the tree given by ``--tree`` (default: the one this script
lies in), stopping at its first step, under ``/usr/bin/time -v``; a tree that does not read
token files tokenizes the texts as before.
Writes bench/results/stage_first_step-<time>.json (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
STAGES = ("sft", "reward_model", "ppo")
BUDGET = {"prompt": 128, "response": 256}  # bench/data_scale.py's validation config
COLUMNS = {"sft": ("prompt", "response"), "preference": ("prompt", "chosen", "rejected"),
           "prompts": ("prompt",)}


def _folder(workdir: Path, pairs: int, seed: int) -> Path:
    return workdir / f"pairs_{pairs}_seed{seed}"


def prepare(root: Path, out: Path, pairs: int, seed: int) -> Path:
    """The stand-in for the gate's output (see the module doc) in ``out``, from the data in
    ``root`` -> ``out``."""
    sys.path.insert(0, str(ROOT))
    import pyarrow as pa

    from bench.data_scale import write_data, write_model
    from data_checks.tokens import TokenWriter, tokens_path
    from data_checks.validate import ensure_special_tokens
    from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer

    data, model = write_data(root, pairs, seed), None
    model = write_model(root, data["preference"])
    (out / "data").mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(model)
    ensure_special_tokens(tok)
    tok.save_pretrained(out / "data" / "tokenizer")
    for name, cols in COLUMNS.items():
        cleaned = out / "data" / f"{name}.jsonl"
        with open(data[name], encoding="utf-8") as src, open(cleaned, "w") as dst, \
                TokenWriter(tokens_path(cleaned)) as tokens:
            while True:
                lines = [line for _, line in zip(range(10_000), src)]
                if not lines:
                    break
                rows = [json.loads(line) for line in lines]
                ids = {c: tok([r[c] for r in rows], add_special_tokens=False)["input_ids"]
                       for c in cols}
                keep = [all(len(ids[c][i]) <= BUDGET["prompt" if c == "prompt" else
                                                     "response"] for c in cols)
                        for i in range(len(rows))]
                dst.writelines(line for line, k in zip(lines, keep) if k)
                tokens.write(pa.table({f"{c}_ids": [x for x, k in zip(ids[c], keep) if k]
                                       for c in cols}))
    for name in ("rm", "critic"):
        load_pretrained(model, LoadSpec(), "new_head").save(out / name)
    (out / "norm.json").write_text(json.dumps({"mean": 0.0, "std": 1.0, "n": 2}))
    (out / "config.json").write_text(json.dumps({
        "seed": 0, "model": {"base_model": str(model), "device": "cpu"},
        "data": {n: {"path": str(out / "data" / f"{n}.jsonl")} for n in COLUMNS},
        "validation": {"max_prompt_tokens": BUDGET["prompt"],
                       "max_response_tokens": BUDGET["response"]},
        "sft": {"log_every": 1, "checkpoint_every": 0},
        "reward": {"log_every": 1, "checkpoint_every": 0},
        "ppo": {"checkpoint_every": 0, "sample_every": 1000},
        "tracking": {"experiment": "stage-first-step", "workdir": str(out / "runs"),
                     "progress": False}}, indent=1))
    return out


class FirstStep(Exception):
    pass


def child(folder: Path, stage: str, tree: Path) -> dict:
    """In a fresh process: the stage's body from ``tree`` until its first step."""
    sys.path.insert(0, str(tree))
    os.chdir(tree)
    from tasks.config.pipeline_config import load_config
    from tasks.pipeline.prepare import Prepared
    from tasks.pipeline.stages.records import Artifact, DataRecord, ModelRecord, NormRecord
    from tasks.pipeline.stages.table import STAGES as TABLE
    from tasks.platform.mlflow.runs import RunContext
    from tests.fake_stage import FakeStageContext

    cfg = load_config(folder / "config.json")
    work = Path(cfg.tracking.workdir) / f"{stage}-{os.getpid()}"
    ctx = RunContext(tracking_uri=f"sqlite:///{work}/mlflow.db", experiment_id="0",
                     parent_run_id="parent", workdir=str(work), seed=cfg.seed)
    base = cfg.model.base_model
    prep = Prepared(ctx=ctx, data=cfg.data, base_model=base, tokenizer=base, judge="none")
    data = DataRecord(data=Artifact(path=str(folder / "data")),
                      tokenizer=Artifact(path=str(folder / "data" / "tokenizer")))

    def model(path) -> ModelRecord:
        return ModelRecord(model=Artifact(path=str(path)))

    inputs = {"sft": dict(prep=prep, data=data),
              "reward_model": dict(prep=prep, data=data, start=model(base)),
              "ppo": dict(prep=prep, data=data, start=model(base), rm=model(folder / "rm"),
                          critic=model(folder / "critic"),
                          norm=NormRecord(stats_file=Artifact(path=str(folder / "norm.json")),
                                          stats={"mean": 0.0, "std": 1.0, "n": 2}))}[stage]
    sc = FakeStageContext(cfg, stage, work, seed=cfg.seed)
    seen: dict = {}

    def live(total):
        def on_log(step, metrics):
            seen["first_step"] = time.perf_counter()
            raise FirstStep
        return on_log

    sc.live = live
    start = time.perf_counter()
    try:
        TABLE[stage].body(sc, **inputs)
    except FirstStep:
        pass
    if "first_step" not in seen:
        raise SystemExit(f"{stage}: no first step")
    return {"stage": stage, "imports_s": round(start - T0, 1),
            "body_to_first_step_s": round(seen["first_step"] - start, 1),
            "process_to_first_step_s": round(seen["first_step"] - T0, 1)}


def run_stage(folder: Path, stage: str, tree: Path) -> dict:
    """``child`` under ``/usr/bin/time -v`` with this interpreter -> its figures + peak MB."""
    cmd = ["/usr/bin/time", "-v", sys.executable, __file__, "_child", "--folder", str(folder),
           "--stage", stage, "--tree", str(tree)]
    env = {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        print(out.stdout[-3000:], out.stderr[-3000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"{stage} failed (exit {out.returncode})")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    for line in out.stderr.splitlines():
        if "Maximum resident set size" in line:
            figures["peak_rss_mb"] = round(int(line.rsplit(":", 1)[1]) / 1024)
    figures["load_after"] = os.getloadavg()[0]
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("prepare", "time", "_child"))
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/rlhf-data-scale"))
    parser.add_argument("--stages-dir", type=Path, default=Path("/tmp/rlhf-stage-first-step"))
    parser.add_argument("--stage", action="append", choices=STAGES)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the source tree to time")
    parser.add_argument("--label", default="")
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.what == "_child":
        print(json.dumps(child(args.folder, args.stage[0], args.tree.resolve())))
        return 0
    root = _folder(args.workdir, args.pairs, args.seed)
    folder = _folder(args.stages_dir, args.pairs, args.seed)
    if args.what == "prepare":
        start = time.perf_counter()
        print(f"prepared {prepare(root, folder, args.pairs, args.seed)} in "
              f"{time.perf_counter() - start:.0f} s")
        return 0
    rows = []
    for stage in args.stage or STAGES:
        load = os.getloadavg()[0]
        figures = {"pairs": args.pairs, "label": args.label, "tree": str(args.tree),
                   "load_before": load, **run_stage(folder, stage, args.tree)}
        rows.append(figures)
        print(f"{args.pairs:>8,} {args.label:>7} {stage:>12}: first step "
              f"{figures['body_to_first_step_s']:6.1f} s after the body's start "
              f"({figures['process_to_first_step_s']:6.1f} s after the process's), peak "
              f"{figures.get('peak_rss_mb', 0):,} MB, load {load:.1f}", flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "bench" / "results" / f"stage_first_step-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
