"""Closing the pipeline run: curves as PNG on the parent run, summary, final status."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.utilities.annotations import quote

from tasks.pipeline.results import PipelineResult
from tasks.pipeline.retention import drop_resume_state
from tasks.pipeline.stages.ppo import STAGE as PPO
from tasks.pipeline.stages.records import StageRecord
from tasks.pipeline.stages.run import latest
from tasks.platform.mlflow.artifacts import log_artifact
from tasks.platform.mlflow.runs import (
    PLOTS,
    RunContext,
    end_run,
    mark_ended,
    stage_metric_histories,
)

CURVES = (("objective/scores", "normalised RM score"), ("objective/kl", "KL to reference"),
          ("judge/score", "gold judge score"))


def plot_ppo_curves(ctx: RunContext) -> str | None:
    """reward / KL / judge per iteration -> plots/ppo_curves.png on the parent run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    histories = stage_metric_histories(ctx, PPO.name, [k for k, _ in CURVES])
    if histories is None:
        return None
    present = [(k, label) for k, label in CURVES if histories[k]]
    if not present:
        return None
    fig, axes = plt.subplots(1, len(present), figsize=(4 * len(present), 3), squeeze=False)
    for ax, (key, label) in zip(axes[0], present):
        points = sorted((m.step, m.value) for m in histories[key])
        ax.plot([p[0] for p in points], [p[1] for p in points])
        ax.set_title(label)
        ax.set_xlabel("PPO iteration")
    fig.tight_layout()
    path = f"{ctx.workdir}/ppo_curves.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    log_artifact(ctx.client(), ctx.parent_run_id, path, PLOTS)
    return path


@task(name="finish")
def finish_task(ctx: RunContext, outputs: dict[str, StageRecord],
                keep_resume_state: bool) -> PipelineResult:
    """Log the plots and close the parent run (``close_finished``) -> the run's result."""
    plot_ppo_curves(ctx)
    close_finished(ctx, keep_resume_state)
    return PipelineResult.of(ctx, outputs)


def finish(ctx: RunContext, outputs: dict[str, StageRecord],
           keep_resume_state: bool) -> PipelineResult:
    """The finish task, with graph edges only from the latest stages it summarises."""
    return finish_task(quote(ctx), quote(outputs), keep_resume_state,
                       wait_for=latest(outputs.values()))


def close_finished(ctx: RunContext, keep_resume_state: bool) -> None:
    end_run(ctx.client(), ctx.parent_run_id, "FINISHED")
    if not keep_resume_state:
        drop_resume_state(Path(ctx.workdir))


def fail_parent(ctx: RunContext) -> None:
    """Mark the parent run FAILED, or KILLED on a stop signal (an unreachable store does not
    replace the flow's error)."""
    mark_ended(ctx.client(), ctx.parent_run_id)
