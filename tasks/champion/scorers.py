"""The gate's scorer: one the challenger was not optimised against.

``retrain.gate.scorer``: ``auto`` (the gold judge where the data has one, else
``judge_model``), ``judge`` (the gold judge), ``judge_model`` (a reward model trained from
the SFT policy on a held-out hash split of the preference pairs, ``judge_fraction``, which the
reward model PPO optimises against never sees), ``reward_model`` (the new reward model: it
favours the challenger, for comparison only) or ``models:/<name>@<alias>`` (a registered
MLflow pyfunc scoring a DataFrame with ``prompt`` and ``response`` columns, e.g. a larger
reward model or an LLM judge wrapped as pyfunc).
"""

from __future__ import annotations

import shutil

from prefect import task

from rlhf_core.gate import held_out_for_judge, pair_key
from tasks.common import read_jsonl
from tasks.config import PipelineConfig
from tasks.stages.records import Artifact, DataRecord
from tasks.tracking.artifacts import local_copy
from tasks.tracking.models import load_pyfunc
from tasks.tracking.runs import RunContext, set_tags
from tasks.tracking.tags import (
    JUDGE_SPLIT_BATCH_PAIRS_HELD_TAG,
    JUDGE_SPLIT_JUDGE_PAIRS_TAG,
    JUDGE_SPLIT_RM_PAIRS_TAG,
)

BUILT_IN = ("judge", "judge_model", "reward_model")


def resolve_scorer(cfg: PipelineConfig, judge_name: str) -> str:
    """``retrain.gate.scorer`` -> the scorer the gate uses: 'judge', 'judge_model',
    'reward_model' or a ``models:/`` URI (``judge_name``: the run's resolved gold judge)."""
    wanted = cfg.retrain.gate.scorer
    if wanted == "auto":
        return "judge" if judge_name != "none" else "judge_model"
    return wanted


def scorer_label(scorer: str) -> str:
    """How the decision names its scorer."""
    return {"judge": "gold judge", "judge_model": "held-out judge reward model",
            "reward_model": "new reward model"}.get(scorer, f"external scorer {scorer}")


def _write_jsonl(path, rows: list[dict]) -> None:
    import json

    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _split_rows(rows: list[dict], fraction: float) -> tuple[list[dict], list[dict]]:
    held = [held_out_for_judge(r, fraction) for r in rows]
    return [r for r, h in zip(rows, held) if not h], [r for r, h in zip(rows, held) if h]


def batch_pair_keys(prep: dict) -> list[str]:
    """The pairs the retrain's batches brought (rows ``batch_rows`` of the combined
    preference file ``add_batches`` wrote), as ``pair_key``s."""
    rows = prep.get("batch_rows") or []
    if not rows:
        return []
    combined = read_jsonl(prep["data"]["preference"]["path"])
    return sorted({pair_key(r) for span in rows
                   for r in combined[span["first"] - 1:span["last"]]})


@task(name="judge_split")
def judge_split(ctx: RunContext, cfg: PipelineConfig, data: DataRecord,
                batch_keys: list[str] | None = None) -> DataRecord:
    """The validated data with the judge's held-out pairs taken out of ``preference.jsonl``
    (they go to ``judge_preference.jsonl`` beside it) -> the validate output for the reward
    model, with ``judge_rows`` added. Logged on the parent run (``judge_split/data``).
    ``retrain.gate.judge_data: configured``: held-out pairs among ``batch_keys`` (the
    batches') are kept from the reward model but do not train the judge either."""
    source = local_copy(ctx, data.data, "validate's data")
    target = ctx.stage_dir("judge_split") / "data"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
    train, held = _split_rows(read_jsonl(source / "preference.jsonl"),
                              cfg.retrain.gate.judge_fraction)
    n_held = len(held)
    if cfg.retrain.gate.judge_data == "configured" and batch_keys:
        from_batches = set(batch_keys)
        held = [r for r in held if pair_key(r) not in from_batches]
    if not train or not held:
        raise ValueError(f"judge split: {len(train)} pairs for the reward model and "
                         f"{len(held)} for the judge; both need some "
                         "(retrain.gate.judge_fraction)")
    _write_jsonl(target / "preference.jsonl", train)
    _write_jsonl(target / "judge_preference.jsonl", held)
    client = ctx.client()
    client.log_artifacts(ctx.parent_run_id, str(target), "judge_split/data")
    set_tags(client, ctx.parent_run_id, {JUDGE_SPLIT_RM_PAIRS_TAG: str(len(train)),
                                         JUDGE_SPLIT_JUDGE_PAIRS_TAG: str(len(held)),
                                         JUDGE_SPLIT_BATCH_PAIRS_HELD_TAG: str(
                                             n_held - len(held))})
    uri = f"runs:/{ctx.parent_run_id}/judge_split/data"
    return data.model_copy(update={"data": Artifact(path=str(target), uri=uri),
                                   "judge_rows": str(target / "judge_preference.jsonl")})


def load_external(uri: str, tracking_uri: str):
    """A registered pyfunc scorer (``models:/<name>@<alias>``) from the run's MLflow store;
    the process's MLflow settings are left as they were."""
    return load_pyfunc(uri, tracking_uri)


def external_scores(model, prompts: list[str], responses: list[str]) -> list[float]:
    """The pyfunc's predict on a (prompt, response) DataFrame -> one float per row."""
    import numpy as np
    import pandas as pd

    out = model.predict(pd.DataFrame({"prompt": list(prompts), "response": list(responses)}))
    if isinstance(out, pd.DataFrame):
        out = out.iloc[:, 0]
    values = np.asarray(out, dtype=float).reshape(-1)
    if len(values) != len(prompts):
        raise ValueError(f"external scorer: {len(values)} scores for {len(prompts)} rows")
    return values.tolist()


