"""Config of the scheduled retrain and its champion/challenger gate (``retrain:`` section)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from rlhf_core.config import REGISTERED_SCORER
from rlhf_core.forms import Section, defaults_in_words

_Frozen = Section


class ScheduleConfig(_Frozen):
    model_config = ConfigDict(json_schema_extra=defaults_in_words)  # empty: no schedule

    cron: str | None = Field(None, description="Cron expression, e.g. '0 3 * * 1'.")
    timezone: str = Field("UTC", description="Time zone of the cron expression.")
    interval_s: float | None = Field(None, gt=0, description="Or: run every N seconds.")

    @model_validator(mode="after")
    def _one(self) -> ScheduleConfig:
        if (self.cron is None) == (self.interval_s is None):
            raise ValueError("retrain.schedule: set exactly one of cron / interval_s")
        return self


class GateConfig(_Frozen):
    """Move ``champion`` only on a significant win with no guard-rail failure."""

    min_prompts: int = Field(200, ge=1, description="Held-out prompts the paired test needs.")
    num_prompts: int = Field(256, ge=1, description="Held-out prompts used (first N, fixed).")
    margin: float = Field(0.0, description="The CI's lower end must exceed this score margin.")
    confidence: float = Field(0.95, gt=0, lt=1, description="Bootstrap interval level.")
    n_bootstrap: int = Field(2000, ge=100, description="Bootstrap resamples.")
    max_eos_drop: float = Field(0.05, ge=0, description="EOS rate may fall at most this much.")
    max_kl: float = Field(25.0, gt=0, description="Cap on the challenger's KL to reference.")
    scorer: str = Field("auto", description=(
        "Who scores both policies: auto (the gold judge when the data has one, else "
        "judge_model), judge, judge_model (an RM trained on held-out pairs the PPO reward "
        "model never sees), reward_model (the new RM: biased to the challenger), or "
        "models:/<name>@<alias> (a registered pyfunc scoring prompt, response)."))
    judge_fraction: float = Field(0.2, gt=0, lt=1, description=(
        "judge_model: share of the preference pairs (by hash) held out to train it."))
    judge_epochs: float | None = Field(None, gt=0, description=(
        "judge_model: epochs over its pairs (None: reward.epochs)."))
    judge_data: Literal["configured", "all"] = Field("configured", description=(
        "judge_model: train on the held-out pairs of the configured data only (a batch under "
        "test never teaches the judge that decides on it), or on every held-out pair."))

    @field_validator("scorer")
    @classmethod
    def _known_scorer(cls, v: str) -> str:
        if v in ("auto", "judge", "judge_model", "reward_model") or \
                REGISTERED_SCORER.fullmatch(v):
            return v
        raise ValueError(f"retrain.gate.scorer {v!r}: expected auto, judge, judge_model, "
                         "reward_model or models:/<name>@<alias>")


class RetrainConfig(_Frozen):
    watch_dir: str = Field("preference_batches", description=(
        "Folder that receives preference batches (.jsonl/.json/.csv/.parquet files)."))
    schedule: ScheduleConfig | None = Field(None, description="None: manual runs only.")
    on_overlap: Literal["skip", "wait"] = Field(
        "skip", description="A retrain that finds another running: skip it, or wait.")
    rm_data: Literal["cumulative", "new_only"] = Field(
        "cumulative", description="Reward model on the configured pairs + every consumed "
        "batch + the new ones, or on the new batches only.")
    rm_init: Literal["champion", "sft"] = Field(
        "champion", description="Warm-start the RM from the champion's RM, or from SFT.")
    policy_init: Literal["champion", "sft"] = Field(
        "champion", description="PPO starts from the champion policy, or afresh from SFT.")
    reference: Literal["champion", "sft"] = Field(
        "sft", description="PPO reference policy (KL anchor): the SFT policy, or the champion.")
    rm_epochs: float | None = Field(None, gt=0, description="Reward-model epochs of a "
                                    "retrain (None: reward.epochs).")
    ppo_iterations: int | None = Field(None, ge=1, description=(
        "PPO iterations of a retrain, which continues from the champion (None: a third of "
        "ppo.iterations, at least 1)."))
    gate: GateConfig = Field(GateConfig())
    approval: Literal["none", "required"] = Field("none", description=(
        "none: the gate's promote moves champion at once; required: the challenger is "
        "registered as candidate and champion moves only when a person approves (the flow "
        "run's form in the Prefect UI, or `rlhf approve`)."))
    approval_timeout_h: float = Field(72.0, gt=0, description=(
        "Hours a candidate waits for an answer; none by then keeps the champion "
        "(recorded as timed out)."))
    gc_batch_age_days: float = Field(30.0, ge=0, description=(
        "`rlhf gc`: consumed and quarantined batch files older than this many days are "
        "deleted (a consumed batch's copy stays on the retrain run that consumed it); a "
        "batch no retrain consumed always stays."))
