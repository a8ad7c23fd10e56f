"""What the flows return, typed from the stage records up to the command line, the sweep, the
events and the tests: a :class:`PipelineResult` (the stage records by stage and where the run
lives), a :class:`RetrainResult`, a :class:`CompareResult` and a :class:`SweepResult`.
Nothing is parsed back out of a display string: a registered version is
``result.registered.version``, a retrain's gate verdict ``result.decision``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SerializeAsAny, field_validator

from tasks.stages.records import (
    DataRecord,
    Decision,
    HealthRecord,
    PolicyRecord,
    RegisterRecord,
    StageRecord,
)
from tasks.tracking.runs import RunContext


class PipelineResult(BaseModel):
    """One tracked run (a pipeline, a retrain, a validation, a sweep point): its MLflow
    parent run and each stage's record, in the order the stages ran."""

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
        """Records read back as JSON (a result stored by Prefect) become the record class
        the stage table names for them."""
        if not isinstance(stages, dict):
            return stages
        from tasks.stages.table import STAGES

        return {name: STAGES[name].record.model_validate(out)
                if isinstance(out, dict) and name in STAGES else out
                for name, out in stages.items()}

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
        """The validate stage's record."""
        return self._stage("validate", DataRecord)

    @property
    def health(self) -> HealthRecord | None:
        """What watching PPO found (None: no ppo stage ran)."""
        ppo = self._stage("ppo", PolicyRecord)
        return None if ppo is None else ppo.health

    @property
    def registered(self) -> RegisterRecord | None:
        """The register stage's record (None: no register stage ran)."""
        return self._stage("register", RegisterRecord)

    @property
    def metrics(self) -> dict[str, float]:
        """Every stage's key figures in one mapping (a later stage's wins a clash)."""
        return {k: v for out in self.stages.values() for k, v in out.metrics.items()}

    @property
    def wall_s(self) -> float:
        """The stages' wall times added up."""
        return round(sum(out.wall_s for out in self.stages.values()), 1)


RetrainStatus = Literal["bootstrapped", "promoted", "kept", "control", "skipped",
                        "nothing new", "awaiting approval", "approved", "rejected",
                        "timed out"]


class RetrainResult(BaseModel):
    """A retrain round: what it did, the gate's decision (a challenge), the tracked run (a
    round that trained), the slot's holder (skipped) or the consumed count (nothing new);
    with ``retrain.approval: required``, the candidate's version and, once answered, what
    the answer came to."""

    model_config = ConfigDict(frozen=True)
    status: RetrainStatus
    decision: Decision | None = None
    run: PipelineResult | None = None
    slot: str | None = None
    held_by: str | None = None
    consumed: int = 0
    candidate: int | None = None  # the version waiting for (or given) a person's answer
    answer: str | None = None  # what the answer came to (an answered round)


class CompareResult(BaseModel):
    """Two registered versions through the gate: which (``champion`` the base, then the
    challenger), the decision and the tracked run."""

    model_config = ConfigDict(frozen=True)
    champion: int
    challenger: int
    decision: Decision
    run: PipelineResult


class SweepResult(BaseModel):
    """A sweep: its id and MLflow run, the summary's rows, groups and markdown, and the
    labels of the points that failed."""

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
