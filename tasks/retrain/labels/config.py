"""Config of on-policy collection and of labels coming back (``collect:`` section)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from data_checks.label_quality import LabelRules
from rlhf_core.forms import Section
from tasks.retrain.config import ScheduleConfig

_Frozen = Section


# Why 40 known pairs, 0.75 and 25 (binomial arithmetic, exact): a labeller passes with at least
# ceil(0.75 m) of the m >= 25 known pairs they answered a or b right. A coin-flipper (p = 0.5)
# answering all 40 passes with P(Bin(40, 0.5) >= 30) = 0.11%; skipping to any m in 25..40
# does not help: the worst, m = 25, P(Bin(25, 0.5) >= 19) = 0.73%; m < 25: held back, not
# enough known answers. An honest labeller at the demo judge's noise on known pairs (at least
# 88% right, docs/retraining.md) answering all 40 fails with P(Bin(40, 0.88) <= 29) = 0.62%.
# tests/data_checks/test_label_quality.py measures both by simulation.
class LabelQualityConfig(_Frozen):
    """When a labeller's votes are dropped, and when an imported batch is quarantined."""

    min_known_agreement: float = Field(0.75, ge=0, le=1, description=(
        "Hold back a labeller, and quarantine a batch, whose answers to the known pairs are "
        "right less often (with 40 known pairs: a coin-flipper passes 0.11%, an honest "
        "labeller right 88% of the time fails 0.62%)."))
    min_known_labelled: int = Field(25, ge=1, description=(
        "Known pairs a labeller, and a batch, must answer a or b to be judged at all; fewer: "
        "held back / quarantined as 'not enough known answers' (a coin-flipper answering "
        "25 passes 0.73%)."))
    max_skip_rate: float = Field(0.5, ge=0, le=1, description=(
        "Hold back a labeller who skipped a larger share of their rows."))
    max_skip_rise: float = Field(0.25, ge=0, le=1, description=(
        "Quarantine a batch whose skip rate is this far above the median of the last "
        "accepted batches'."))
    max_rm_drop: float = Field(0.25, ge=0, le=1, description=(
        "Quarantine a batch whose agreement with the policy's reward model is this far "
        "below the median of the last accepted batches'."))

    def rules(self) -> LabelRules:
        return LabelRules(self.min_known_agreement, self.min_known_labelled,
                          self.max_skip_rate)


class DestinationConfig(_Frozen):
    """Where a collection's pairs go to be labelled: files, or a Label Studio project."""

    kind: Literal["files", "label_studio"] = Field("files", description=(
        "files: <out_dir>/<id>.jsonl/.csv, back with `rlhf label import`; label_studio: a "
        "project on a Label Studio server, back with `rlhf label pull`."))
    url: str | None = Field(None, description=(
        "Label Studio server (LABEL_STUDIO_URL wins; the key is LABEL_STUDIO_API_KEY, "
        "never in the config)."))
    project: str | None = Field(None, description=(
        "Project title (created when missing; None: 'rlhf <registered policy>')."))
    annotations_per_task: int = Field(1, ge=1, description=(
        "Finished annotations a task needs to count as labelled."))
    min_labelled: float = Field(0.9, gt=0, le=1, description=(
        "Share of a collection's tasks labelled before a pull makes a batch (--partial: "
        "at once)."))
    pull_schedule: ScheduleConfig | None = Field(ScheduleConfig(interval_s=600), description=(
        "When the served label-pull deployment pulls (None: manual runs only)."))


class CollectConfig(_Frozen):
    """Sample a registered policy on fresh prompts and write a file for labellers."""

    policy: str = Field("champion", description="Registered policy version or alias sampled.")
    prompts: str | None = Field(None, description=(
        "Prompt pool file (prompt column); None: data.prompts (the demo: its training "
        "prompts)."))
    num_prompts: int = Field(192, ge=1, description="Fresh prompts per collection.")
    k: int = Field(4, ge=2, description="Responses sampled per prompt; paired (1,2), (3,4)...")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    max_new_tokens: int | None = Field(None, ge=1, description=(
        "Response token budget (None: ppo.max_new_tokens)."))
    known_pairs: int = Field(40, ge=0, description=(
        "Known-answer pairs mixed into each labelling file (demo: judged by the gold judge; "
        "else drawn from `gold`); each labeller must answer quality.min_known_labelled of "
        "them, so every labeller labels the whole file."))
    gold: str | None = Field(None, description=(
        "File of known answers (prompt, chosen, rejected) for the known-answer pairs."))
    out_dir: str = Field("to_label", description="Folder the labelling files are written to.")
    batch_size: int = Field(64, ge=1, description="Prompts sampled at once.")
    schedule: ScheduleConfig | None = Field(None, description="None: manual runs only.")
    quality: LabelQualityConfig = Field(LabelQualityConfig())
    destination: DestinationConfig = Field(DestinationConfig())
