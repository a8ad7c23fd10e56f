"""What the flows return, typed all the way to the CLI and tests so nothing is parsed back
out of a display string (a retrain's results are in tasks/retrain/records.py); and the run's
own summary where a Prefect user lands: a flow-run artifact with each stage's key figures, the
registry decision and why, and links into MLflow."""

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
from tasks.platform.mlflow.addresses import run_page, runs_table_url
from tasks.platform.mlflow.runs import RunContext
from tasks.platform.redact import redact


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


SUMMARY_KEY = "rlhf-run-summary"


def _cell(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def decision_line(result: PipelineResult) -> str:
    """What the run did with its policy: registered as champion or challenger, and why."""
    reg = result.registered
    if reg is None:
        return "Nothing registered (no register stage ran)."
    if not reg.registered:
        return "Nothing registered (tracking.register_models is false)."
    role = "promoted to champion" if reg.promoted else "kept as challenger"
    why = f": {reg.reason}" if reg.reason else ""
    return (f"Registered `models:/{reg.model_name}/{reg.version}` ({role}{why}) and the reward "
            f"model `models:/{reg.reward_model_name}/{reg.reward_model_version}`.")


def summary_markdown(result: PipelineResult, title: str, outcome: str | None = None) -> str:
    """The artifact's text: ``title``, the decision (``outcome`` overrides it), the MLflow
    links, the stage table."""
    page = run_page(result.tracking_uri, result.experiment_id, result.parent_run_id)
    parent = f"[{result.parent_run_id}]({page})" if page else \
        f"`{result.parent_run_id}` (`mlflow ui --backend-store-uri {redact(result.tracking_uri)}`)"
    table = runs_table_url(result.tracking_uri, result.experiment_id)
    rows = []
    for name, stage in result.stages.items():
        wall = "skipped" if stage.skipped else f"{stage.wall_s:.1f}"
        shown = ", ".join(f"{k} {_cell(v)}" for k, v in list(stage.metrics.items())[:3])
        rows.append(f"| {name} | {wall} | {shown} |")
    notes = result.notes
    return "\n".join([
        f"# {title}", "", outcome or decision_line(result), "",
        *[f"- {line}" for line in notes], *([""] if notes else []),
        f"MLflow parent run: {parent} · [runs table]({table}) (select two parent runs, then "
        "Compare)", "",
        "| stage | wall s | key figures |", "|---|---|---|", *rows,
        f"| all stages | {result.wall_s:.1f} | |", ""])


def _publish(markdown: str, description: str) -> None:
    """``markdown`` as the flow run's summary artifact (call it in the flow, not a task, so it
    belongs to the run)."""
    from prefect.artifacts import create_markdown_artifact
    from prefect.context import FlowRunContext, TaskRunContext

    if FlowRunContext.get() is not None and TaskRunContext.get() is None:
        create_markdown_artifact(key=SUMMARY_KEY, markdown=markdown, description=description)


def publish_summary(result: PipelineResult, title: str, outcome: str | None = None) -> None:
    _publish(summary_markdown(result, title, outcome), "the run: stages, decision, MLflow links")


def publish_text(title: str, text: str) -> None:
    """A summary of ``title`` and ``text`` alone, for a round resumed with an answer."""
    _publish(f"# {title}\n\n{text}\n", "the run: what the answer came to")
