"""Typed configs for the data gate: where the data comes from and what it must satisfy."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class DataSource(_Frozen):
    path: str = Field(description="Local .jsonl/.json/.csv/.parquet file, folder, or dataset id.")
    format: Literal["auto", "jsonl", "csv", "parquet", "hf"] = Field(
        "auto", description="auto: by file extension; hf: datasets.load_dataset / load_from_disk."
    )
    split: str = Field("train", description="Split for format 'hf'.")
    style: Literal["plain", "conversational", "hh", "tldr"] = Field(
        "plain", description="plain: prompt/response/chosen/rejected columns (after column_map),"
        " or TRL's conversational formats when a column holds message lists; conversational:"
        " insist on those (messages, prompt/completion, prompt/chosen/rejected, implicit"
        " prompt; a string prompt is one user message), rendered with the chat template;"
        " hh: Anthropic-HH transcripts in chosen/rejected (prompt = shared dialogue up to the"
        " last Assistant turn); tldr: summarize-from-feedback rows (info/summaries/choice, or"
        " subreddit/title/post/summary for SFT)."
    )
    column_map: dict[str, str] = Field(
        default_factory=dict, description="Source column -> prompt/response/chosen/rejected."
    )

    @field_validator("column_map")
    @classmethod
    def _one_source_per_target(cls, value: dict[str, str]) -> dict[str, str]:
        targets = list(value.values())
        doubled = sorted({t for t in targets if targets.count(t) > 1})
        if doubled:
            sources = {t: [s for s, x in value.items() if x == t] for t in doubled}
            raise ValueError("column_map maps several source columns onto one name: " +
                             "; ".join(f"{', '.join(v)} -> {t}" for t, v in sources.items()))
        return value
    limit: int | None = Field(None, ge=1, description="Read at most N rows.")


class DataConfig(_Frozen):
    sft: DataSource = Field(
        description="Demonstrations: prompt, response columns (or TRL's messages), e.g. "
        "path data/sft.jsonl.", examples=[{"path": "data/sft.jsonl"}])
    preference: DataSource = Field(
        description="Pairs: prompt, chosen, rejected columns, e.g. path data/pairs.parquet.",
        examples=[{"path": "data/pairs.parquet"}])
    prompts: DataSource = Field(
        description="PPO prompts: a prompt column, e.g. path data/prompts.csv.",
        examples=[{"path": "data/prompts.csv"}])
    eval_prompts: DataSource | None = Field(
        None, description="Held-out prompts for evaluation (None: the first PPO prompts; "
        "a retrain's gate needs them), "
        "e.g. path data/heldout.jsonl.", examples=[{"path": "data/heldout.jsonl"}])
    preference_eval: DataSource | None = Field(
        None, description="Held-out pairs for the reward model's accuracy (None: "
        "reward.eval_fraction of the pairs), e.g. path data/pairs_eval.jsonl.",
        examples=[{"path": "data/pairs_eval.jsonl"}])


class ValidationConfig(_Frozen):
    max_prompt_tokens: int = Field(48, ge=1, description="Prompt token budget.")
    max_response_tokens: int = Field(32, ge=2, description="Response budget, EOS included.")
    long_response_policy: Literal["drop", "truncate"] = Field(
        "drop", description="What to do with responses over budget."
    )
    max_truncated_fraction: float = Field(0.2, ge=0, le=1, description="Allowed truncated share.")
    max_dropped_fraction: float = Field(0.1, ge=0, le=1, description="Allowed dropped share.")
    length_mismatch_warn_ratio: float = Field(
        1.5, ge=1, description="Warn when SFT/preference median response lengths differ more."
    )
    example_rows: int = Field(3, ge=1, description="Example rows shown per failure.")
    control_characters: Literal["warn", "refuse"] = Field(
        "warn", description="Text with NUL or other control characters: warn or refuse.")
    unknown_token_warn_share: float = Field(
        0.2, ge=0, le=1, description="Warn when more of a data set's tokens are unknown.")
