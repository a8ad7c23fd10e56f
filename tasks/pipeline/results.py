"""What the flows return, typed all the way to the CLI and tests so nothing is parsed back
out of a display string (a retrain's results are in tasks/retrain/records.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, SerializeAsAny, field_validator

from tasks.pipeline.stages.records import (
    DataRecord,
    PolicyRecord,
    RegisterRecord,
    StageRecord,
    record_class,
)
from tasks.platform.mlflow.runs import RunContext


class PipelineResult(BaseModel):
    """One tracked run: its MLflow parent run and each stage's record, in the order run."""

    model_config = ConfigDict(frozen=True)
    parent_run_id: str
    experiment_id: str
    tracking_uri: str
    workdir: str
    stages: dict[str, SerializeAsAny[StageRecord]]
    run_name: str = ""  # the MLflow parent run's name (and its Prefect flow run's)

    @field_validator("stages", mode="before")
    @classmethod
    def _typed_by_stage(cls, stages: Any) -> Any:
        """Records read back as JSON become the class each ``kind`` names."""
        if not isinstance(stages, dict):
            return stages
        typed = {}
        for name, out in stages.items():
            kind = record_class(out.get("kind", "")) if isinstance(out, dict) else None
            typed[name] = out if kind is None else kind.model_validate(out)
        return typed

    @classmethod
    def of(cls, ctx: RunContext, stages: dict[str, StageRecord]) -> PipelineResult:
        return cls(parent_run_id=ctx.parent_run_id, experiment_id=ctx.experiment_id,
                   tracking_uri=ctx.tracking_uri, workdir=ctx.workdir, stages=stages,
                   run_name=ctx.run_name)

    def _stage(self, name: str, kind: type) -> Any:
        out = self.stages.get(name)
        return out if isinstance(out, kind) else None

    @property
    def data(self) -> DataRecord | None:
        return self._stage("validate", DataRecord)

    @property
    def notes(self) -> list[str]:
        """The summary's lines: the critic's start, what watching PPO found, the alignment tax."""
        critic = getattr(self.stages.get("critic_init"), "figures", {}).get("critic")
        ppo = self._stage("ppo", PolicyRecord)
        lines = [f"critic: {critic}"] if critic else []
        lines += ppo.health.lines() if ppo is not None else []
        return lines + [tax for tax in [getattr(self.stages.get("evaluate"), "tax", "")] if tax]

    @property
    def registered(self) -> RegisterRecord | None:
        """The register stage's record (None: it did not run)."""
        return self._stage("register", RegisterRecord)

    @property
    def metrics(self) -> dict[str, float]:
        """Every stage's key figures in one mapping (a later stage's wins a clash)."""
        return {k: v for out in self.stages.values() for k, v in out.metrics.items()}

    @property
    def wall_s(self) -> float:
        return round(sum(out.wall_s for out in self.stages.values()), 1)


class SweepResult(BaseModel):
    """A sweep's run, summary and failed points."""

    model_config = ConfigDict(frozen=True)
    sweep_id: str
    parent_run_id: str
    experiment_id: str
    tracking_uri: str
    metric: str
    groups: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    failed: list[str]
    markdown: str
