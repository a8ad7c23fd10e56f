"""The gate's scorer (``retrain.gate.scorer``): one the challenger was not optimised against,
so its verdict is not the reward model grading its own student (``reward_model`` is for
comparison only).
"""

from __future__ import annotations

from rlhf_core.eval.gate import pair_key
from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.prepare import Prepared
from tasks.platform.files import read_jsonl

BUILT_IN = ("judge", "judge_model", "reward_model")


def resolve_scorer(cfg: PipelineConfig, judge_name: str) -> str:
    """``retrain.gate.scorer`` -> a built-in scorer or a ``models:/`` URI (``auto``: the gold
    judge if any, else ``judge_model``)."""
    wanted = cfg.retrain.gate.scorer
    if wanted == "auto":
        return "judge" if judge_name != "none" else "judge_model"
    return wanted


def scorer_label(scorer: str) -> str:
    """How the decision names its scorer."""
    return {"judge": "gold judge", "judge_model": "held-out judge reward model",
            "reward_model": "new reward model"}.get(scorer, f"external scorer {scorer}")


def batch_pair_keys(prep: Prepared) -> list[str]:
    """The ``pair_key``s of the pairs the retrain's batches brought."""
    if not prep.batch_rows:
        return []
    combined = read_jsonl(prep.data.preference.path)
    return sorted({pair_key(r) for span in prep.batch_rows
                   for r in combined[span["first"] - 1:span["last"]]})
