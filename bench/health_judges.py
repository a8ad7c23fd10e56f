"""Other judges on the health benchmark's recorded runs: does a stronger judge see more?

    python bench/health.py run --out DIR                 # the recorded runs, first
    python bench/health_judges.py --out DIR --pairs 2000  # a judge on more held-out pairs
    python bench/health_judges.py --out DIR --members 4   # the mean of four judges (seeds)
                                                          #   and their disagreement
    python bench/health_judges.py --out DIR --perturbed 1000  # + pairs with one corruption
    python bench/health_judges.py --out DIR --gold-noise 2 [--draw 1]  # gold + N(0, 2)

The judge changes nothing PPO does (the checks leave training bit-identical), so a run with
another judge gives the same answers at every check: only their judge scores differ. For each
data seed this trains the judge as the ``judge_model`` stage does (the demo config, the run's
SFT policy, the stage's seed), scores every recorded check answer with it, writes the records
with those scores to ``DIR-<variant>/`` and replays the detectors there
(``bench/health.py report --replay``). With ``--pairs 500 --members 1`` the judge is the
pipeline's own and the scores are the recorded ones to within float rounding (the largest
change is printed: 1.4e-6 on seeds 1 and 2).

With ``--members K`` each answer's judge score is the mean of K judges (the stage's seed, then
that seed + 1000, + 2000, ...), and ``judge_spread`` the standard deviation of their K scores:
the ensembles' reading of "the scorers disagree where the policy left their data".

``--perturbed N`` adds N held-out pairs to the judge's: a demo answer against the same answer
with one generic corruption (a word of the demo's vocabulary inserted, a word repeated or
dropped, two neighbours swapped), labelled by the demo's rater as every pair is. It asks
whether a judge shown such edits sees the ones a policy makes.

``--gold-noise SIGMA`` trains nothing: the judge is the gold score plus independent normal
noise (per answer and check, drawn from ``--draw``'s seed), a scorer whose errors owe nothing
to the reward model's. It measures the rule apart from the judge: how the detectors fare
with a scorer of a given agreement with the gold judge.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import health  # noqa: E402  (bench/health.py, beside this file)

MEMBER_SEED_STRIDE = 1000  # judge k of an ensemble: the stage's seed + k * this


def data_seed(rec: dict) -> int:
    """The ``seed=`` of a recorded case (0 where it sets none)."""
    return next((int(o.split("=", 1)[1]) for o in rec["overrides"] if o.startswith("seed=")),
                0)


def perturbation_pairs(n: int, seed: int) -> list[dict]:
    """``n`` pairs on held-out prompts: a demo answer and the same answer with one corruption,
    (chosen, rejected) drawn by the demo's rater (a Bradley-Terry draw on the gold judge)."""
    import random

    from rlhf_core.demo import bt_label, sample_prompt, sample_response, vocabulary

    rng, words, rows = random.Random(f"perturbed:{seed}"), vocabulary(), []
    while len(rows) < n:
        prompt = sample_prompt(rng, held_out=True)
        answer = sample_response(prompt, rng).split()
        edited, at, kind = list(answer), rng.randrange(len(answer)), rng.randrange(4)
        if kind == 0:
            edited.insert(rng.randrange(len(answer) + 1), rng.choice(words))
        elif kind == 1:
            edited.insert(at, answer[at])
        elif kind == 2 and len(answer) > 1:
            del edited[at]
        elif at + 1 < len(answer):
            edited[at], edited[at + 1] = edited[at + 1], edited[at]
        a, b = " ".join(answer), " ".join(edited)
        if a != b:
            chosen, rejected = bt_label(prompt, *((a, b) if rng.random() < 0.5 else (b, a)), rng)
            rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return rows


def train_judge(run_dir: Path, seed: int, pairs: int, member: int, tmp: Path,
                perturbed: int = 0):
    """The judge_model stage's judge for ``seed``'s demo data with ``pairs`` held-out pairs
    (the run's validated pairs when that is what it had), started from the run's SFT policy."""
    import dataclasses

    import torch

    from rlhf_core.demo import generate_demo_data
    from rlhf_core.models.loader import LoadSpec, load_tokenizer
    from rlhf_core.train.optim import seed_everything
    from tasks.config.pipeline_config import load_config
    from tasks.pipeline.stages.judge_model import STAGE, fit_judge
    from tasks.pipeline.stages.reward_model import preference_split

    cfg = load_config(ROOT / "configs" / "demo.yaml", [f"seed={seed}"])
    spec = LoadSpec()
    tokenizer = load_tokenizer(run_dir / "validate" / "tokenizer", spec)
    folder = run_dir / "validate"
    if pairs != cfg.demo.n_pref_eval or perturbed:
        folder = tmp / f"data-{seed}-{pairs}"
        generate_demo_data(folder, seed, dataclasses.replace(cfg.demo.sizes(), n_pref_eval=pairs))
        with open(folder / "preference_eval.jsonl", "a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in perturbation_pairs(perturbed, seed))
    generator = seed_everything(seed + STAGE.seed_offset + MEMBER_SEED_STRIDE * member)
    split = preference_split(folder, tokenizer, cfg.reward)
    judge = fit_judge(run_dir / "sft" / "model", split.held_out, split.held_rows,
                      tokenizer.pad_token_id, cfg, spec, torch.device("cpu"), generator)
    return judge.eval(), tokenizer


def score_checks(judge, tokenizer, case_dir: Path) -> dict[int, list[float]]:
    """The judge's score of every recorded check answer of a case -> {iteration: [N]}, one
    answer at a time (the prompt, the response and its EOS, as the check scored them)."""
    import torch

    from rlhf_core.models.data import encode
    from rlhf_core.ppo.rollout import score_responses

    (checks,) = glob.glob(str(case_dir / "mlruns" / "*" / "artifacts" / "checks"))
    out = {}
    for path in sorted(Path(checks).glob("iter_*.json")):
        table = json.loads(path.read_text())
        rows = [dict(zip(table["columns"], row)) for row in table["data"]]
        scores = []
        with torch.inference_mode():
            for r in rows:
                prompt = encode(tokenizer, r["prompt"])
                response = encode(tokenizer, r["response"])
                response += [tokenizer.eos_token_id] if r["has_eos"] else []
                ids = torch.tensor([prompt + response])
                mask = torch.ones(1, len(response), dtype=torch.bool)
                scores.append(float(score_responses(judge, ids, tokenizer.pad_token_id,
                                                    len(prompt), mask)[0]))
        out[rows[0]["iteration"]] = scores
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="bench/health.py's DIR")
    parser.add_argument("--pairs", type=int, default=500, help="held-out pairs per judge")
    parser.add_argument("--members", type=int, default=1, help="judges (seeds), mean score")
    parser.add_argument("--perturbed", type=int, default=0,
                        help="held-out pairs added: an answer against itself with one edit")
    parser.add_argument("--gold-noise", type=float, default=None, metavar="SIGMA",
                        help="no judge trained: the gold score + N(0, SIGMA) per answer")
    parser.add_argument("--draw", type=int, default=0, help="--gold-noise: the noise's seed")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    records = {p.stem: json.loads(p.read_text()) for p in sorted(args.out.glob("*.json"))
               if p.stem != "report"}
    if args.gold_noise is None:
        target = args.out.with_name(f"{args.out.name}-judge-{args.pairs}x{args.members}"
                                    + (f"+{args.perturbed}" if args.perturbed else ""))
        target.mkdir(exist_ok=True)
        rescore(records, args, target)
    else:
        target = args.out.with_name(
            f"{args.out.name}-gold-noise-{args.gold_noise:g}-{args.draw}")
        target.mkdir(exist_ok=True)
        for name, rec in records.items():
            noisy = with_noisy_gold_judge(rec, args.gold_noise, f"{name}:{args.draw}")
            (target / f"{name}.json").write_text(json.dumps(noisy))
    rescored = {p.stem: json.loads(p.read_text()) for p in sorted(target.glob("*.json"))
                if p.stem in records}
    print(json.dumps(summarise(health.report(target, replay=True), rescored), indent=1))


def with_noisy_gold_judge(rec: dict, sigma: float, key: str) -> dict:
    """``rec`` with every check's judge score the gold score + N(0, sigma), drawn from a
    generator seeded by ``key`` (the same draws on every machine)."""
    import random
    import zlib

    rng = random.Random(zlib.crc32(f"{key}:{sigma}".encode()))
    rec = json.loads(json.dumps(rec))
    for check in rec["checks"]:
        check["judge"] = [g + rng.gauss(0.0, sigma) for g in check["gold"]]
    return rec


def rescore(records: dict[str, dict], args, target: Path) -> None:
    """Each case's check answers scored by judges trained as the stage trains its own."""
    import torch

    torch.set_num_threads(args.threads)
    by_seed: dict[int, list[str]] = {}
    for name, rec in records.items():
        by_seed.setdefault(data_seed(rec), []).append(name)
    with tempfile.TemporaryDirectory() as tmp:
        for seed, names in sorted(by_seed.items()):
            run_dir = Path(glob.glob(str(args.out / names[0] / "rlhf_runs" / "*"))[0])
            members: dict[str, dict[int, list[list[float]]]] = {}
            for member in range(args.members):
                judge, tokenizer = train_judge(run_dir, seed, args.pairs, member, Path(tmp),
                                               args.perturbed)
                for name in names:
                    got = score_checks(judge, tokenizer, args.out / name)
                    for it, scores in got.items():
                        members.setdefault(name, {}).setdefault(it, []).append(scores)
            for name in names:
                rec = json.loads(json.dumps(records[name]))
                gap = 0.0
                for check in rec["checks"]:
                    per_answer = list(zip(*members[name][check["iteration"]]))
                    new = [statistics.fmean(s) for s in per_answer]
                    gap = max([gap, *(abs(a - b) for a, b in zip(new, check["judge"]))])
                    check["judge"] = new
                    if args.members > 1:
                        check["judge_spread"] = [statistics.pstdev(s) for s in per_answer]
                (target / f"{name}.json").write_text(json.dumps(rec))
                print(f"seed {seed} {name}: largest change of a judge score {gap:.4g}",
                      flush=True)


def summarise(result: dict, records: dict[str, dict]) -> dict:
    """The replayed report's reward-hacking figures: (case, onset, found) of each induced
    case and each healthy run the gold judge calls over-optimised, the false alarms and the
    judge's agreement with the gold judge on the healthy runs; with several judges, their
    disagreement at each check (``records``: the rescored cases)."""
    summary = {
        "reward_hacking": [(r["case"], r["onset"], r["detected"]) for r in result["failures"]
                           if r["detector"] == "reward_hacking"],
        "healthy_over_optimised": [(n, v["onset"], v["detected"]) for n, v in
                                   result["gold_hacking_in_healthy_runs"].items()],
        "false_alarms": {n: a for n, a in result["false_alarms"].items() if a},
        "judge_agreement_healthy": [
            result["agreement_with_gold"][n]["judge"] for n in health.HEALTHY
            if n in result["agreement_with_gold"]]}
    spread = {n: [(c["iteration"], round(statistics.fmean(c["judge_spread"]), 2))
                  for c in rec["checks"]] for n, rec in records.items()
              if rec["checks"] and "judge_spread" in rec["checks"][0]}
    if spread:  # the members' disagreement: the mean over answers of their scores' std
        summary["judge_spread"] = {n: spread[n] for n in ("hacking", "hacking-length")
                                   if n in spread}
        healthy = [s for n in health.HEALTHY if n in spread for _, s in spread[n]]
        summary["judge_spread_healthy"] = {"min": min(healthy), "max": max(healthy)}
    agree = summary["judge_agreement_healthy"]
    if agree:
        summary["judge_agreement_healthy"] = {"min": min(agree), "max": max(agree),
                                              "median": statistics.median(agree)}
    return summary


if __name__ == "__main__":
    main()
