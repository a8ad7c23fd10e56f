"""The data gate at real sizes (issue 37): seeded HH-style data and a byte-level BPE tokenizer
at N preference pairs, then `rlhf validate` on it, timed, with its peak memory.

    python bench/data_scale.py --pairs 20000                 # one size
    python bench/data_scale.py --pairs 20000 --pairs 200000  # several, one table
    python bench/data_scale.py --pairs 200000 --retrain 5000  # + a retrain round's gate
    python bench/data_scale.py --pairs 200000 --format csv --format conversational  # formats

The data, per size N: N preference pairs (prompt 20-60 words, chosen and rejected 30-150
words), N SFT rows (prompt, response) and N/4 PPO prompts, the sizes of the issue's run (about
1.05M texts at 200k pairs). About 0.5% of the rows of each set are bad in the ways real data
is, none of them failing the gate: a response far over the token budget (dropped), a prompt
over it with a paragraph break (cut there), a control character (a warning). The words are
pseudo-words drawn with Zipf frequencies from one seeded stream, so the first rows are the
same at every size. The tokenizer (8k vocabulary, byte-level BPE trained with `tokenizers` on
the first 20k pairs) and a tiny GPT-2 are saved beside the data: GPT-2's conventions (EOS =
BOS = UNK ``<|endoftext|>``, no PAD: the gate adds one).

Each size is validated in a fresh `rlhf validate` process with the validation cache off and
MLflow and Prefect local to the size's folder, under ``/usr/bin/time -v``: the wall and CPU
seconds are the command's, the peak memory its largest resident set (without time(1): the
largest of this script's children so far). The tree measured is the one the script lies in:
for a "before", run a copy of it inside an export of the older commit. Writes
bench/results/data_scale-<time>.json (``--out`` to change); the data is kept under
``--workdir`` (default /tmp/rlhf-data-scale) and reused when it is there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/data_formats.py
from data_formats import CHAT_TEMPLATE, FORMATS, write_format  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EOS = "<|endoftext|>"
BAD_SHARE = 0.005
SYLLABLES = ("ka ri to me an su lo ve pi da ne ru mo si te ha yu bo ze li go na fe wi "
             "ul or en as it ex om ur ab ly").split()


class Words:
    """Pseudo-words with Zipf frequencies, drawn from one seeded stream."""

    def __init__(self, seed: int, vocab: int = 6000):
        self.rng = np.random.default_rng(seed)
        lengths = self.rng.integers(1, 4, size=vocab)
        picks = self.rng.integers(0, len(SYLLABLES), size=(vocab, 3))
        words = {"".join(SYLLABLES[j] for j in row[:n]) for row, n in zip(picks, lengths)}
        self.words = np.array(sorted(words))
        ranks = np.arange(1, len(self.words) + 1)
        self.p = (1.0 / ranks) / (1.0 / ranks).sum()
        self.rng.shuffle(self.words)

    def text(self, lo: int, hi: int) -> str:
        n = int(self.rng.integers(lo, hi + 1))
        return " ".join(self.words[self.rng.choice(len(self.words), size=n, p=self.p)])


def _spoil(row: dict, col: str, words: Words, kind: int) -> dict:
    """One bad row: 0 a response far over budget, 1 a prompt over it with a paragraph break,
    2 a control character."""
    if kind == 0 and col != "prompt":
        row[col] = words.text(400, 450)
    elif kind in (0, 1):
        row["prompt"] = row["prompt"] + "\n" + words.text(300, 320)
    else:
        text = row[col]
        row[col] = text[: len(text) // 2] + "\x07" + text[len(text) // 2:]
    return row


def write_data(root: Path, pairs: int, seed: int) -> dict[str, Path]:
    """The three data sets at ``pairs`` preference pairs (see the module doc)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = {n: root / f"{n}.jsonl" for n in ("preference", "sft", "prompts")}
    if all(p.exists() for p in paths.values()):
        return paths
    words = Words(seed)
    shapes = {"preference": (pairs, ("chosen", "rejected")), "sft": (pairs, ("response",)),
              "prompts": (pairs // 4, ())}
    for name, (n, replies) in shapes.items():
        _write_rows(paths[name], words, n, replies)
    return paths


def _write_rows(path: Path, words: Words, n: int, replies: tuple[str, ...]) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(n):
            row = {"prompt": words.text(20, 60)}
            row.update({c: words.text(30, 150) for c in replies})
            if words.rng.random() < BAD_SHARE:
                kind = int(words.rng.integers(0, 3))
                row = _spoil(row, replies[0] if replies else "prompt", words, kind)
            fh.write(json.dumps(row) + "\n")
    return path


def write_model(root: Path, preference: Path, vocab: int = 8000) -> Path:
    """Byte-level BPE (``vocab`` tokens) trained on the first 20k pairs, with a tiny GPT-2."""
    out = root / "model"
    if (out / "config.json").exists():
        return out
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    def texts():
        with open(preference, encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                if i >= 20_000:
                    return
                row = json.loads(line)
                yield from (row["prompt"], row["chosen"], row["rejected"])

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(texts(), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=EOS, eos_token=EOS,
                                  unk_token=EOS, model_max_length=1024)
    tok.save_pretrained(out)
    config = GPT2Config(vocab_size=len(tok) + 1, n_embd=64, n_layer=2, n_head=2,
                        n_positions=1024, bos_token_id=tok.eos_token_id,
                        eos_token_id=tok.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(out)
    return out


def write_config(root: Path, data: dict[str, Path], model: Path,
                 chat_template: str | None = None) -> Path:
    cfg = {"seed": 0, "model": {"base_model": str(model), "device": "cpu",
                                **({"chat_template": chat_template} if chat_template else {})},
           "data": {name: {"path": str(p)} for name, p in data.items()},
           "validation": {"max_prompt_tokens": 128, "max_response_tokens": 256},
           "tracking": {"experiment": "data-scale", "workdir": str(root / "runs"),
                        "progress": False}}
    path = root / "config.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def run_validate(root: Path, config: Path, cache: Path | None = None,
                 log_level: str = "WARNING") -> dict:
    """`rlhf validate --config config` in a fresh process under ``/usr/bin/time -v`` -> wall,
    CPU seconds and peak resident memory of the process tree (``cache``: the validation cache
    it uses; None: off), and how many chunks it tokenized and read from the cache."""
    env = {**os.environ, "RLHF_VALIDATION_CACHE": str(cache) if cache else "off",
           "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
           "PREFECT_HOME": str(root / "prefect"), "PREFECT_LOGGING_LEVEL": log_level}
    env.pop("PREFECT_API_URL", None)
    timed = Path("/usr/bin/time").exists()
    cmd = (["/usr/bin/time", "-v"] if timed else []) + \
        [sys.executable, "-m", "cli", "validate", "--config", str(config)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        print(out.stdout[-3000:], out.stderr[-3000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"rlhf validate failed (exit {out.returncode})")
    peak_kib = after.ru_maxrss  # without time(1): the largest child so far
    for line in out.stderr.splitlines():
        if "Maximum resident set size" in line:
            peak_kib = int(line.rsplit(":", 1)[1])
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    chunks = re.search(r"tokenized (\d+) chunks? of data; (\d+) chunks? came",
                       out.stdout + out.stderr)
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "peak_rss_mb": round(peak_kib / 1024), "stdout_tail": out.stdout[-1500:],
            **({"chunks_tokenized": int(chunks[1]), "chunks_from_cache": int(chunks[2])}
               if chunks else {})}


def run_retrain_gate(root: Path, config: Path, batch_pairs: int, seed: int) -> dict:
    """A retrain round's gate: `rlhf validate` with a fresh validation cache on the configured
    data (the first round: everything tokenized, the chunks kept), then on the next round's
    data (the configured pairs and a new batch of ``batch_pairs`` in one file, written by the
    retrain's own tasks/retrain/batches.py ``write_round_pairs``) twice: with that cache,
    and with the cache off (every chunk tokenized, as before chunks were kept)."""
    import shutil

    sys.path.insert(0, str(ROOT))  # this tree's packages, whatever the working folder
    from data_checks.config import DataSource
    from data_checks.loading import load_table
    from tasks.retrain.batches import write_round_pairs

    cache = root / "retrain-cache"
    shutil.rmtree(cache, ignore_errors=True)
    first = run_validate(root, config, cache, "INFO")  # INFO: the stage's chunk counts
    cfg = json.loads(config.read_text())
    batch = _write_rows(root / f"batch_{batch_pairs}.jsonl", Words(seed + 1), batch_pairs,
                        ("chosen", "rejected"))
    pairs = root / "round" / "preference.jsonl"
    pairs.parent.mkdir(exist_ok=True)
    write_round_pairs(pairs, DataSource(path=cfg["data"]["preference"]["path"]),
                      [(batch.name, load_table(DataSource(path=str(batch)), "preference"))])
    cfg["data"]["preference"]["path"] = str(pairs)
    round_config = root / "round" / "config.json"
    round_config.write_text(json.dumps(cfg, indent=1))
    warm = run_validate(root, round_config, cache, "INFO")
    cold = run_validate(root, round_config, None, "INFO")
    shutil.rmtree(cache, ignore_errors=True)
    return {"retrain_batch_pairs": batch_pairs, "first_round_gate_s": first["wall_s"],
            "round_gate_s": warm["wall_s"], "round_gate_cpu_s": warm["cpu_s"],
            "round_gate_peak_rss_mb": warm["peak_rss_mb"],
            "round_chunks_tokenized": warm.get("chunks_tokenized"),
            "round_chunks_from_cache": warm.get("chunks_from_cache"),
            "round_gate_cache_off_s": cold["wall_s"], "round_gate_cache_off_cpu_s": cold["cpu_s"]}


STEPS = 20  # SFT and reward-model steps of --pipeline (the run)


def run_pipeline(root: Path, config: Path, pairs: int) -> dict:
    """`rlhf run --config config` with 20 SFT and 20 reward-model steps, one PPO iteration and
    no registration, in a fresh process under ``/usr/bin/time -v`` -> its wall, CPU and peak
    memory, and from MLflow's records: the first SFT step's time after the command started,
    and each training stage's first step after that stage started (its child run's start and
    its first ``train/loss`` point, logged every step here)."""
    from mlflow.tracking import MlflowClient

    epochs = STEPS * 16 / (pairs * 0.9)  # batch 16; 10% of the pairs held out by the RM
    env = {**os.environ, "RLHF_VALIDATION_CACHE": "off",
           "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
           "PREFECT_HOME": str(root / "prefect"), "PREFECT_LOGGING_LEVEL": "WARNING"}
    env.pop("PREFECT_API_URL", None)
    sets = [f"sft.epochs={epochs:.8f}", f"reward.epochs={epochs:.8f}", "sft.log_every=1",
            "reward.log_every=1", "ppo.iterations=1", "ppo.rollout_batch_size=16",
            "eval.num_prompts=16", "tracking.register_models=false",
            "tracking.experiment=data-scale-pipeline", f"tracking.run_name=bench-{time.time():.0f}"]
    timed = Path("/usr/bin/time").exists()
    cmd = (["/usr/bin/time", "-v"] if timed else []) + \
        [sys.executable, "-m", "cli", "run", "--config", str(config)] + \
        [arg for item in sets for arg in ("--set", item)]
    start_ms = time.time() * 1000
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        print(out.stdout[-3000:], out.stderr[-3000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"rlhf run failed (exit {out.returncode})")
    peak_kib = next((int(line.rsplit(":", 1)[1]) for line in out.stderr.splitlines()
                     if "Maximum resident set size" in line), 0)
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("data-scale-pipeline")
    runs = client.search_runs([exp.experiment_id], f"attributes.start_time >= {int(start_ms)}")
    stages = {r.data.tags.get("rlhf.stage"): r for r in runs}
    figures = {"pipeline_wall_s": round(wall, 1), "pipeline_peak_rss_mb": round(peak_kib / 1024)}
    for stage in ("validate", "sft", "reward_model", "ppo"):
        run = stages.get(stage)
        if run is None:
            continue
        figures[f"{stage}_start_after_command_s"] = round((run.info.start_time - start_ms) / 1e3,
                                                          1)
        if stage in ("sft", "reward_model"):
            first = min(m.timestamp for m in client.get_metric_history(run.info.run_id,
                                                                        "train/loss"))
            figures[f"{stage}_first_step_after_stage_start_s"] = round(
                (first - run.info.start_time) / 1e3, 1)
            figures[f"{stage}_first_step_after_command_s"] = round((first - start_ms) / 1e3, 1)
    return figures


def run_gate_resume(root: Path, config: Path, pairs: int) -> dict:
    """`rlhf run` SIGKILLed in its gate once all but two chunks are tokenized (their token ids
    kept in ``validate/.chunks/``), then `rlhf run --resume` in the same run: the resumed
    gate's wall (the stage's ``time/stage_s``) and how many chunks were kept. The resumed run
    is stopped once its gate is done (``RLHF_CRASH_AT=after:validate``)."""
    import signal

    from mlflow.tracking import MlflowClient

    chunks = sum(-(-n // 25_000) for n in (pairs, pairs, pairs // 4))
    env = {**os.environ, "RLHF_VALIDATION_CACHE": "off",
           "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
           "PREFECT_HOME": str(root / "prefect"), "PREFECT_LOGGING_LEVEL": "WARNING"}
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "cli", "run", "--config", str(config), "--set",
           "tracking.experiment=data-scale-resume"]
    runs = root / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    folder = None
    while proc.poll() is None:
        new = set(runs.iterdir()) - before if runs.exists() else set()
        folder = next(iter(new), None)
        if folder and len(list((folder / "validate" / ".chunks").glob("*.arrow"))) >= \
                chunks - 2:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    proc.wait()
    if folder is None or proc.returncode != -signal.SIGKILL:
        raise SystemExit("the gate ended before it could be killed")
    kept = len(list((folder / "validate" / ".chunks").glob("*.arrow")))
    log = root / "resume.log"
    with open(log, "w") as fh:  # not a pipe: the run's Prefect server outlives its SIGKILL
        resumed = subprocess.Popen(cmd + ["--resume", folder.name], cwd=ROOT, stdout=fh,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**env, "RLHF_CRASH_AT": "after:validate"})
        resumed.wait()
    for group in (proc.pid, resumed.pid):  # what the two killed runs left running
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    child = client.search_runs(
        [client.get_experiment_by_name("data-scale-resume").experiment_id],
        f"tags.`mlflow.parentRunId` = '{folder.name}' and tags.`rlhf.stage` = 'validate'")
    walls = child and client.get_metric_history(child[0].info.run_id, "time/stage_s")
    if not walls:
        print(log.read_text()[-3000:], file=sys.stderr)
        raise SystemExit("the resumed gate did not finish")
    return {"resume_chunks_total": chunks, "resume_chunks_kept": kept,
            "resumed_gate_s": round(walls[-1].value, 1)}  # the resumed run's stage wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, action="append", help="preference pairs (repeat)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/rlhf-data-scale"))
    parser.add_argument("--label", default="", help="a name for this tree (before/after)")
    parser.add_argument("--format", action="append", choices=FORMATS,
                        help="the data's format (repeat; default plain JSONL)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--pipeline", action="store_true",
                        help="also `rlhf run` (20 SFT and reward-model steps, one PPO "
                        "iteration): each stage's time to its first step")
    parser.add_argument("--resume", action="store_true",
                        help="also kill `rlhf run` in its gate two chunks before the end and "
                        "time the resumed gate")
    parser.add_argument("--retrain", type=int, metavar="PAIRS",
                        help="also a retrain round's gate with a new batch of PAIRS pairs: "
                        "with the validation cache (the first round's chunks kept) and "
                        "without")
    args = parser.parse_args(argv)
    rows = []
    for pairs, fmt in [(p, f) for p in args.pairs or [20_000] for f in args.format or
                       ["plain"]]:
        root = args.workdir / f"pairs_{pairs}_seed{args.seed}"
        t0 = time.perf_counter()
        data = write_data(root, pairs, args.seed)
        model = write_model(root, data["preference"])
        if fmt != "plain":  # its own data, runs and stores
            data, root = write_format(data, fmt, root / fmt), root / fmt
        made = time.perf_counter() - t0
        figures = run_validate(root, write_config(
            root, data, model, CHAT_TEMPLATE if fmt == "conversational" else None))
        print(f"{pairs:>9,} pairs  {fmt:>14}  validate {figures['wall_s']:7.1f} s wall "
              f"{figures['cpu_s']:7.1f} CPU-s  peak {figures['peak_rss_mb']:6,} MB", flush=True)
        if args.pipeline:
            figures.update(run_pipeline(root, root / "config.json", pairs))
            print("  ".join(f"{k} {v}" for k, v in figures.items() if k.startswith(
                ("pipeline", "sft", "reward_model", "ppo"))), flush=True)
        if args.resume:
            figures.update(run_gate_resume(root, root / "config.json", pairs))
            print(f"  resumed gate {figures['resumed_gate_s']} s, "
                  f"{figures['resume_chunks_kept']} of {figures['resume_chunks_total']} "
                  "chunks kept", flush=True)
        if args.retrain:
            figures.update(run_retrain_gate(root, root / "config.json", args.retrain,
                                            args.seed))
            print(f"  retrain round (+{args.retrain:,} pairs): gate "
                  f"{figures['round_gate_s']} s with the cache "
                  f"(chunks tokenized: {figures['round_chunks_tokenized']}, "
                  f"from the cache: {figures['round_chunks_from_cache']}), "
                  f"{figures['round_gate_cache_off_s']} s without", flush=True)
        rows.append({"pairs": pairs, "format": fmt, "label": args.label,
                     "data_s": round(made, 1), **figures,
                     "cpu_s_per_10k_pairs": round(figures["cpu_s"] * 1e4 / pairs, 1)})
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "bench" / "results" / f"data_scale-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
