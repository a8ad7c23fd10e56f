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

from rlhf_core.eval.gate import pair_key
from tasks.common import read_jsonl
from tasks.config import PipelineConfig
from tasks.prepare import Prepared
from tasks.tracking.models import load_pyfunc

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


def batch_pair_keys(prep: Prepared) -> list[str]:
    """The pairs the retrain's batches brought (rows ``batch_rows`` of the combined
    preference file ``add_batches`` wrote), as ``pair_key``s."""
    if not prep.batch_rows:
        return []
    combined = read_jsonl(prep.data.preference.path)
    return sorted({pair_key(r) for span in prep.batch_rows
                   for r in combined[span["first"] - 1:span["last"]]})


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


