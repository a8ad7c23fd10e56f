"""A scorer from outside the pipeline: a registered MLflow pyfunc (``models:/<name>@<alias>``)
scoring a DataFrame with ``prompt`` and ``response`` columns, e.g. a larger reward model or an
LLM judge wrapped as pyfunc. Evaluate and the health watch (``ppo.health.scorer``) and the
retrain gate (``retrain.gate.scorer``) score answers with it."""

from __future__ import annotations

from tasks.platform.mlflow.models import load_pyfunc


def load_external(uri: str, tracking_uri: str):
    """A registered pyfunc scorer (``models:/<name>@<alias>``) from the run's MLflow store;
    the process's MLflow settings are left as they were."""
    return load_pyfunc(uri, tracking_uri)


def external_scores(model, prompts: list[str], responses: list[str]) -> list[float]:
    """The pyfunc's predict on a (prompt, response) DataFrame -> one float per row."""
    import numpy as np
    import pandas as pd

    out = model.predict(pd.DataFrame({"prompt": list(prompts), "response": list(responses)}))
    if isinstance(out, pd.DataFrame):
        out = out.iloc[:, 0]
    values = np.asarray(out, dtype=float).reshape(-1)
    if len(values) != len(prompts):
        raise ValueError(f"external scorer: {len(values)} scores for {len(prompts)} rows")
    return values.tolist()


