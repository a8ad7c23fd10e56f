"""Typed stage outputs: what each stage returns, records on its child run (read back to skip
a finished stage) and hands on. A written file is an :class:`Artifact` (local path and MLflow
URI), so a stage on another machine can fetch it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from tasks.platform.mlflow.artifacts import Artifact


class StageRecord(BaseModel):
    """What every stage output holds: where it ran, how long, its key figures."""

    model_config = ConfigDict(extra="forbid")
    stage: str = ""
    run_id: str = ""
    wall_s: float = 0.0
    peak_gpu_gb: float | None = None  # the CUDA allocator's peak in this process (on CUDA)
    skipped: bool = False
    metrics: dict[str, float] = {}
    figures: dict[str, Any] = {}

    @computed_field
    @property
    def kind(self) -> str:
        """The record's class, in its JSON so a result read back is rebuilt as it was
        (:func:`record_class`). Computed, not a field: Prefect would link tasks sharing it."""
        return type(self).__name__

    @model_validator(mode="before")
    @classmethod
    def _drop_kind(cls, data: Any) -> Any:
        """``kind`` is recomputed, not an input."""
        if isinstance(data, dict) and "kind" in data:
            data = {k: v for k, v in data.items() if k != "kind"}
        return data


class DataRecord(StageRecord):
    """validate: the cleaned data folder and the tokenizer; a retrain's judge split points
    ``data`` at its own folder and adds ``judge_rows``."""

    data: Artifact
    tokenizer: Artifact
    pad_added: bool = False
    conversational: bool = False
    warnings: list[str] = []
    judge_rows: str | None = None


class ModelRecord(StageRecord):
    """One saved model folder (None: none saved, e.g. critic_init without a critic)."""

    model: Artifact | None = None
    source: str | None = None
    fresh_head: bool = False  # critic_init: a new head on the start policy, not the RM's


class NormRecord(StageRecord):
    """reward_norm: the statistics file and its values ({mean, std, n})."""

    stats_file: Artifact
    stats: dict[str, float]


class HealthFinding(BaseModel):
    """A health detector that fired during PPO: when, what it saw, its action and advice."""

    model_config = ConfigDict(extra="forbid")
    detector: str
    failure: str
    iteration: int
    onset: int
    last_healthy: int
    action: str  # warn or stop
    message: str
    advice: str
    evidence: dict[str, float] = {}
    # why the finding still questions the final policy (None: it does not, or only warns)
    stands: str | None = None

    def line(self) -> str:
        return (f"{self.failure} ({self.detector}) at iteration {self.iteration}: "
                f"{self.message}. Advice: {self.advice}.")


class HealthRecord(BaseModel):
    """What watching PPO found, and whether it stopped PPO (and at which snapshot)."""

    model_config = ConfigDict(extra="forbid")
    checks: int = 0  # held-out checks made
    findings: list[HealthFinding] = []
    stopped_by: str | None = None  # the detector whose stop ended PPO
    restored_iteration: int | None = None  # the snapshot the stopped stage's policy is

    @property
    def flags(self) -> list[str]:
        return [f.detector for f in self.findings]

    def lines(self) -> list[str]:
        out = [f"PPO health: {f.line()}" + (f" It still stands at the end: {f.stands}."
                                            if f.stands else "") for f in self.findings]
        if self.stopped_by is not None:
            out.append(f"PPO stopped: {self.blocks_champion}.")
        return out

    @property
    def blocks_champion(self) -> str | None:
        """Why this policy may not become champion without an override (None: it may):
        PPO was stopped, or a finding still stands at its end."""
        if self.stopped_by is not None:
            kept = "" if self.restored_iteration is None else \
                f", the policy kept is its snapshot of iteration {self.restored_iteration}"
            return f"PPO was stopped by its {self.stopped_by} detector{kept}"
        standing = next((f for f in self.findings if f.stands), None)
        if standing is not None:
            return (f"PPO's {standing.detector} detector fired at iteration "
                    f"{standing.iteration} and its finding still stands: {standing.stands}")
        return None


class PolicyRecord(StageRecord):
    """ppo: the trained policy (and value model, with a critic) and its health record."""

    policy: Artifact
    value_dir: str | None = None
    health: HealthRecord = HealthRecord()


class EvalRecord(StageRecord):
    """evaluate: metrics, the headline score's scorer and the start comparison's (None: none)."""

    scorer: str | None = None
    start_scorer: str | None = None
    tax: str = ""  # the alignment tax in one line (said not to apply without a pretrained base)


class RegisterRecord(StageRecord):
    """register: the registered versions and whether the policy became champion."""

    registered: bool
    reason: str = ""  # why the policy was (or was not) promoted
    model_name: str | None = None
    version: int | None = None
    reward_model_name: str | None = None
    reward_model_version: int | None = None
    promoted: bool = False
    awaiting_approval: bool = False  # registered as candidate: champion moves on approval


class SharedStages(BaseModel):
    """The stages a sweep runs once and every point reuses."""

    model_config = ConfigDict(frozen=True)
    validate_: DataRecord = Field(alias="validate")
    sft: ModelRecord
    reward_model: ModelRecord
    reward_norm: NormRecord
    judge_model: ModelRecord | None = None

    def outputs(self) -> dict[str, StageRecord]:
        out = {"validate": self.validate_, "sft": self.sft, "reward_model": self.reward_model,
               "reward_norm": self.reward_norm}
        return out if self.judge_model is None else {**out, "judge_model": self.judge_model}


def record_class(kind: str) -> type[StageRecord] | None:
    """The imported :class:`StageRecord` subclass named ``kind`` (None: none)."""
    todo: list[type[StageRecord]] = [StageRecord]
    while todo:
        cls = todo.pop()
        if cls.__name__ == kind:
            return cls
        todo.extend(cls.__subclasses__())
    return None
