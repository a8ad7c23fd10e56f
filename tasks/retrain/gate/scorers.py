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
from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.prepare import Prepared
from tasks.platform.files import read_jsonl

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
