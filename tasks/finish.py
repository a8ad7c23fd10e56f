"""Closing the pipeline run: curves as PNG on the parent run, summary, final status."""

from __future__ import annotations

from prefect import task

from tasks.stages.ppo import STAGE as PPO
from tasks.stages.records import StageRecord
from tasks.tracking.runs import RunContext, find_stage_run, mark_ended

CURVES = (("objective/scores", "normalised RM score"), ("objective/kl", "KL to reference"),
          ("judge/score", "gold judge score"))


def plot_ppo_curves(ctx: RunContext) -> str | None:
    """reward / KL / judge per iteration -> plots/ppo_curves.png on the parent run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = find_stage_run(ctx, PPO.name)
    if run is None:
        return None
    client = ctx.client()
    histories = {k: client.get_metric_history(run.info.run_id, k) for k, _ in CURVES}
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
    client.log_artifact(ctx.parent_run_id, path, "plots")
    return path


@task(name="finish")
def finish(ctx: RunContext, outputs: dict[str, StageRecord]) -> dict:
    """Log the plots, close the parent run and return the per-stage summary."""
    plot_ppo_curves(ctx)
    close_parent(ctx)
    stages = {name: {"wall_s": out.wall_s, "skipped": out.skipped, "run_id": out.run_id,
                     "metrics": out.metrics, "figures": out.figures}
              for name, out in outputs.items()}
    return {"parent_run_id": ctx.parent_run_id, "experiment_id": ctx.experiment_id,
            "tracking_uri": ctx.tracking_uri, "workdir": ctx.workdir, "stages": stages}


def close_parent(ctx: RunContext) -> None:
    """Mark the parent run FINISHED."""
    ctx.client().set_terminated(ctx.parent_run_id, status="FINISHED")


def fail_parent(ctx: RunContext) -> None:
    """Mark the parent run FAILED, or KILLED on a stop signal (the flow re-raises the
    error; an unreachable store does not replace it)."""
    mark_ended(ctx.client(), ctx.parent_run_id)
