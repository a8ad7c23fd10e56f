"""Sweep tasks: the grid, one MLflow parent run per point, and the summary over points.
A sweep varies RL settings only (``grid_points``), so the stages before PPO run once under the
sweep's own run and every point reuses their outputs."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from typing import Any

from prefect import task

from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.prepare import Prepared, open_parent_run
from tasks.pipeline.results import PipelineResult
from tasks.platform.mlflow.artifacts import log_artifact
from tasks.platform.mlflow.runs import PLOTS, RunContext, log_sweep_summary, tag_parent
from tasks.platform.mlflow.tags import SWEEP_POINT_TAG, SWEEP_SHARED_RUN_TAG, SWEEP_TAG

# two-sided 95% Student t quantiles t_{0.975, df}, df = 1..10 (beyond: normal 1.96)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
COLUMNS = ("status", "eval/judge_win_rate", "eval/kl_to_ref", "eval/rm_score_policy",
           "eval/judge_score_policy", "wall_s", "memory/peak_rss_gb", "memory/model_state_gb")


def point_label(overrides: dict[str, Any]) -> str:
    """'advantage_estimator=rloo,kl_coef=0.05,seed=1' (last part of each key)."""
    return ",".join(f"{k.split('.')[-1]}={v}" for k, v in overrides.items())


@task(name="sweep_point_run")
def open_point_run(cfg: PipelineConfig, base_prep: Prepared, sweep_id: str,
                   overrides: dict[str, Any]) -> Prepared:
    """A new MLflow parent run for one point, tagged with the sweep, reusing the shared inputs."""
    ctx = open_parent_run(cfg, None)
    tag_parent(ctx, {SWEEP_TAG: sweep_id, SWEEP_POINT_TAG: json.dumps(overrides, sort_keys=True),
                     SWEEP_SHARED_RUN_TAG: base_prep.ctx.parent_run_id})
    return base_prep.model_copy(update={"ctx": ctx})


def point_row(overrides: dict[str, Any], result: PipelineResult | None,
              error: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"point": point_label(overrides), **overrides}
    if result is None:
        return {**row, "status": "FAILED", "error": (error or "")[:300]}
    metrics = result.metrics
    row.update({k: metrics[k] for k in COLUMNS if k in metrics})
    row.update({"status": "FINISHED", "parent_run_id": result.parent_run_id,
                "wall_s": result.wall_s})
    return row


def mean_ci(values: list[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% t-interval (None for a single value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    t = T975[len(values) - 2] if len(values) - 1 <= len(T975) else 1.96
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def aggregate(rows: list[dict], metric: str) -> list[dict]:
    """Group finished rows by settings except the seed: n, ``metric`` mean with its 95% CI
    half-width across seeds, and the other columns' means."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if row["status"] == "FINISHED":
            groups[point_label({k: v for k, v in row.items() if "." in k and
                                not k.startswith(("eval/", "memory/"))})].append(row)
    out = []
    for label, members in groups.items():
        mean, half = mean_ci([float(r[metric]) for r in members if metric in r] or [math.nan])
        entry = {"settings": label, "n_seeds": len(members), metric: mean, "ci95": half}
        for key in COLUMNS[1:]:
            values = [float(r[key]) for r in members if key in r and key != metric]
            if values:
                entry[key] = statistics.fmean(values)
        out.append(entry)
    return out


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def summary_markdown(rows: list[dict], groups: list[dict], metric: str) -> str:
    """The sweep's verdict: per settings (mean +- 95% CI across seeds), then every point."""
    keys = [metric, "ci95", *(k for k in COLUMNS[1:] if k != metric)]
    lines = ["## Sweep summary", "", f"| settings | seeds | {' | '.join(keys)} |",
             "|---|---|" + "---|" * len(keys)]
    lines += [f"| {g['settings']} | {g['n_seeds']} | "
              + " | ".join(_fmt(g.get(k)) for k in keys) + " |" for g in groups]
    lines += ["", "### Points", "", f"| point | {' | '.join(COLUMNS)} | run |",
              "|---|" + "---|" * (len(COLUMNS) + 1)]
    lines += [f"| {r['point']} | " + " | ".join(_fmt(r.get(k)) for k in COLUMNS)
              + f" | {r.get('parent_run_id') or r.get('error', '')} |" for r in rows]
    return "\n".join(lines) + "\n"


def frontier_plot(rows: list[dict], metric: str, path: str) -> str | None:
    """The reward/KL frontier: ``metric`` against KL to the reference, coloured by estimator."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["status"] == "FINISHED" and metric in r and "eval/kl_to_ref" in r]
    if not done:
        return None
    fig, ax = plt.subplots(figsize=(5, 4))
    by_estimator: dict[str, list[dict]] = defaultdict(list)
    for r in done:
        by_estimator[str(r.get("ppo.advantage_estimator", "gae"))].append(r)
    for name, members in sorted(by_estimator.items()):
        ax.scatter([r["eval/kl_to_ref"] for r in members], [r[metric] for r in members], label=name)
    ax.set_xlabel("KL to reference (nats)")
    ax.set_ylabel(metric)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


@task(name="sweep_summary")
def sweep_summary(ctx: RunContext, rows: list[dict]) -> dict:
    """Table and frontier plot on the sweep's MLflow run and as Prefect artifacts."""
    from tasks.platform.prefect.prefect_api import in_prefect_run

    metric = "eval/judge_win_rate" if any("eval/judge_win_rate" in r for r in rows) \
        else "eval/rm_score_policy"
    groups = aggregate(rows, metric)
    markdown = summary_markdown(rows, groups, metric)
    log_sweep_summary(ctx, rows, groups, markdown)
    plot = frontier_plot(rows, metric, f"{ctx.workdir}/sweep_frontier.png")
    if plot:
        log_artifact(ctx.client(), ctx.parent_run_id, plot, PLOTS)
    if in_prefect_run():
        from prefect.artifacts import create_markdown_artifact, create_table_artifact

        create_markdown_artifact(key="rlhf-sweep-summary", markdown=markdown,
                                 description="sweep: settings, seeds, 95% CI, points")
        create_table_artifact(key="rlhf-sweep-points", table=rows, description="sweep points")
    failed = [r["point"] for r in rows if r["status"] != "FINISHED"]
    return {"metric": metric, "groups": groups, "rows": rows, "failed": failed,
            "markdown": markdown}
