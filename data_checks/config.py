"""Typed configs for the data gate: where the data comes from and what it must satisfy. A source
whose path is left empty is no source (all of them empty: the demo's data).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

REQUIRED_SOURCES = ("sft", "preference", "prompts")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def blank_source(value: Any) -> bool:
    """A source a form left empty: None, or a mapping without a path."""
    if isinstance(value, Mapping):
        return not str(value.get("path") or "").strip()
    return value is None


def blank_data(value: Any) -> bool:
    """Data sources a form left empty (every source blank): the demo's data."""
    if isinstance(value, Mapping):
        return all(blank_source(v) for v in value.values())
    return value is None


def blank_data_form() -> dict[str, Any]:
    """The demo's data as a form holds it (a form offers no None): every path empty."""
    return {name: {"path": ""} for name in REQUIRED_SOURCES}


class DataSource(_Frozen):
    path: str = Field(description="Local .jsonl/.json/.csv/.parquet file, folder, or dataset "
                      "id; empty: no source.")
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
            raise ValueError("column_map maps several source columns onto one name: " + "; ".join(
                f"{', '.join(s for s, x in value.items() if x == t)} -> {t}" for t in doubled))
        return value
    limit: int | None = Field(None, ge=1, description="Read at most N rows (empty: all).")


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
        None, description="Held-out prompts for evaluation (empty: the first PPO prompts; "
        "a retrain's gate needs them), "
        "e.g. path data/heldout.jsonl.", examples=[{"path": "data/heldout.jsonl"}])
    pretrain: DataSource | None = Field(
        None, description="Raw text for ppo.ptx_coef's pretraining mix: a .txt file "
        "(paragraphs split at blank lines) or a table with a text column, e.g. path "
        "data/pretrain.txt.", examples=[{"path": "data/pretrain.txt"}])
    preference_eval: DataSource | None = Field(
        None, description="Held-out pairs for the reward model's accuracy (empty: "
        "reward.eval_fraction of the pairs), e.g. path data/pairs_eval.jsonl.",
        examples=[{"path": "data/pairs_eval.jsonl"}])

    @model_validator(mode="before")
    @classmethod
    def _empty_paths(cls, value: Any) -> Any:
        """An optional source with an empty path is unset; a required one is an error."""
        if not isinstance(value, Mapping):
            return value
        missing = [n for n in REQUIRED_SOURCES if blank_source(value.get(n))]
        if missing:
            raise ValueError(
                f"data.{', data.'.join(missing)}: no path given; give sft, preference and "
                "prompts each a path (or leave every data path empty for the demo's data)")
        return {k: (None if k not in REQUIRED_SOURCES and blank_source(v) else v)
                for k, v in value.items()}


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
    example_rows: int = Field(5, ge=1, description="Example rows shown per failure.")
    control_characters: Literal["warn", "refuse"] = Field(
        "warn", description="Text with NUL or other control characters: warn or refuse.")
    unknown_token_warn_share: float = Field(
        0.2, ge=0, le=1, description="Warn when more of a data set's tokens are unknown.")
