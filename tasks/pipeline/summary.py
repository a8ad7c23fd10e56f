"""The run's own summary where a Prefect user lands: a flow-run artifact with each stage's key
figures, the registry decision and why, and links into MLflow."""

from __future__ import annotations

from tasks.pipeline.results import PipelineResult
from tasks.platform.mlflow.addresses import run_page, runs_table_url
from tasks.platform.redact import redact

KEY = "rlhf-run-summary"


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
        create_markdown_artifact(key=KEY, markdown=markdown, description=description)


def publish_summary(result: PipelineResult, title: str, outcome: str | None = None) -> None:
    _publish(summary_markdown(result, title, outcome), "the run: stages, decision, MLflow links")


def publish_text(title: str, text: str) -> None:
    """A summary of ``title`` and ``text`` alone, for a round resumed with an answer."""
    _publish(f"# {title}\n\n{text}\n", "the run: what the answer came to")
