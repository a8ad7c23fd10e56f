"""The real-English task (configs/smollm2.yaml) trained against three rewards, alternated per
seed on one machine: the run's reward model alone, the task's instruction rules as a Python
function alone (rlhf_core.english:instruction_rules: the instruction only, not the gold
judge), and both summed. Side by side by the gold judge (win rate and paired interval
against each run's SFT policy) and the alignment tax (probe accuracy of base and policy).

    python bench/reward_sources.py --out DIR --seeds 0,1,2
    python bench/reward_sources.py --out DIR --seeds 0 --ways rules --set ppo.iterations=4

Each run is bench/real_model.py's (a fresh folder, `rlhf run` as a user runs it); writes
DIR/<way>-seed<N>.json and DIR/reward_sources.json (the table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_model import CONFIG, run_seed  # noqa: E402 - the sibling bench

RULES = "{name: rules, kind: function, target: 'rlhf_core.english:instruction_rules'}"
WAYS = {"rm": [], "rules": [f"ppo.reward_sources=[{RULES}]"],
        "both": [f"ppo.reward_sources=[{{name: rm}}, {RULES}]"]}
OUTCOME = ("eval/judge_win_rate", "eval/vs_start_diff", "eval/vs_start_diff_low",
           "eval/vs_start_diff_high", "eval/tax/probe_acc_base", "eval/tax/probe_acc_policy")


def table(records: list[dict]) -> str:
    """One row per way: each outcome's per-seed values and mean."""
    lines = ["way    " + "  ".join(k.removeprefix("eval/") for k in OUTCOME)]
    for way in WAYS:
        runs = [r for r in records if r["name"] == way]
        if not runs:
            continue
        cells = []
        for key in OUTCOME:
            values = [r["eval"][key] for r in runs if r["eval"].get(key) is not None]
            mean = f"{statistics.fmean(values):+.3f}" if values else "-"
            cells.append(f"{mean} ({', '.join(f'{v:+.3f}' for v in values)})")
        lines.append(f"{way:6} " + "  ".join(cells))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", default="0")
    p.add_argument("--ways", default=",".join(WAYS), help=f"of {', '.join(WAYS)}")
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for way in args.ways.split(","):
            records.append(run_seed(args.out, way, seed, [*WAYS[way], *args.set],
                                    args.config.resolve()))
            print(table(records), flush=True)
    (args.out / "reward_sources.json").write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
