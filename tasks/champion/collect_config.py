"""Config of on-policy collection and of labels coming back (``collect:`` section)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.champion.config import ScheduleConfig


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class LabelQualityConfig(_Frozen):
    """When an imported batch of labels is quarantined instead of trained on."""

    min_known_agreement: float = Field(0.6, ge=0, le=1, description=(
        "Quarantine a batch whose majority labels agree with the known answers less often."))
    max_rm_drop: float = Field(0.25, ge=0, le=1, description=(
        "Quarantine a batch whose agreement with the policy's reward model is this far "
        "below the median of the last accepted batches'."))
    min_known_labelled: int = Field(4, ge=1, description=(
        "Known-answer pairs a batch must label (a or b) for its known agreement to count."))


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
    known_pairs: int = Field(16, ge=0, description=(
        "Known-answer pairs mixed into each labelling file (demo: judged by the gold judge; "
        "else drawn from `gold`)."))
    gold: str | None = Field(None, description=(
        "File of known answers (prompt, chosen, rejected) for the known-answer pairs."))
    out_dir: str = Field("to_label", description="Folder the labelling files are written to.")
    batch_size: int = Field(64, ge=1, description="Prompts sampled at once.")
    schedule: ScheduleConfig | None = Field(None, description="None: manual runs only.")
    quality: LabelQualityConfig = Field(LabelQualityConfig())
    destination: DestinationConfig = Field(DestinationConfig())
