"""Whether a config can be retrained at all: the gate's paired test needs
``retrain.gate.min_prompts`` held-out prompts among the first ``retrain.gate.num_prompts``.
The CLI checks it before anything starts (so it imports nothing heavy), a round on its files.
"""

from __future__ import annotations

from tasks.config.pipeline_config import ConfigError, PipelineConfig
from tasks.config.sections import GateConfig

DEMO_ROWS = "demo.n_eval"  # where the demo's held-out prompts are counted


class GateError(ConfigError):
    """The gate cannot run as configured: the user's to fix (the CLI exits 2)."""


def too_few_prompts(gate: GateConfig, rows: int | None, where: str) -> str | None:
    """Why the gate cannot compare on ``rows`` held-out prompts (None rows: none), naming the
    setting to change; None when it can."""
    if rows is None:
        return ("retrain gate: no held-out prompts to compare the policies on; set "
                "data.eval_prompts to a file of at least "
                f"{gate.min_prompts} prompts (retrain.gate.min_prompts)")
    n = min(rows, gate.num_prompts)
    if n >= gate.min_prompts:
        return None
    if gate.num_prompts < gate.min_prompts:
        fix = f"raise retrain.gate.num_prompts to at least {gate.min_prompts}"
    elif where == DEMO_ROWS:
        fix = f"set {DEMO_ROWS} to at least {gate.min_prompts}"
    else:
        fix = f"give {where} at least {gate.min_prompts} rows"
    return (f"retrain gate: {n} held-out prompts ({rows} in {where}, "
            f"retrain.gate.num_prompts {gate.num_prompts}) are fewer than the "
            f"{gate.min_prompts} its paired test needs (retrain.gate.min_prompts); {fix} or "
            "lower retrain.gate.min_prompts")


def held_out_rows(cfg: PipelineConfig, data=None) -> tuple[int | None, str]:
    """(held-out prompt rows a retrain compares on (None: none), their setting as a refusal
    names it): known from the config before any run, or from the ``data`` a round resolved."""
    if data is None and cfg.data is None:
        return (cfg.demo.n_eval, DEMO_ROWS) if cfg.demo.enabled else (None, "")
    source = (cfg.data if data is None else data).eval_prompts
    if source is None:
        return None, ""
    from data_checks.loading import load_table

    where = DEMO_ROWS if cfg.data is None else f"data.eval_prompts ({source.path})"
    return len(load_table(source, "prompts")), where


def check_retrainable(cfg: PipelineConfig, data=None) -> None:
    """GateError when a retrain of ``cfg`` could never reach its gate's decision; with
    ``data``, the same rule inside a round, on the held-out prompts it resolved."""
    why = too_few_prompts(cfg.retrain.gate, *held_out_rows(cfg, data))
    if why is not None:
        raise GateError(why)
