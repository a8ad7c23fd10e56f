"""Config of on-policy collection and of labels coming back (``collect:`` section)."""

from __future__ import annotations

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
