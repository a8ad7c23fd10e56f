"""The policy and the reward model as MLflow models logged as code beside ``rlhf_core``, and
MLflow pointed at a store for one block without changing the process's own settings."""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mlflow
import mlflow.tracking._model_registry.utils as registry_utils
import mlflow.tracking._tracking_service.utils as tracking_utils
import numpy as np
import pandas as pd
from mlflow import MlflowClient
from mlflow.models import ModelSignature
from mlflow.types.schema import AnyType, ColSpec, ParamSchema, ParamSpec, Schema

import rlhf_core
from tasks.platform.mlflow.registry import alias_version

REQUIREMENTS = ["torch", "transformers", "safetensors", "pandas"]


@contextmanager
def mlflow_settings_kept() -> Iterator[None]:
    """Restore the process's MLflow tracking and registry URIs (and their variables, which
    child processes inherit) after the body."""
    saved_env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    saved = (tracking_utils._tracking_uri, registry_utils._registry_uri)
    try:
        yield
    finally:
        tracking_utils._tracking_uri, registry_utils._registry_uri = saved
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def mlflow_pointed_at(uri: str) -> Iterator[None]:
    """MLflow pointed at ``uri`` (registry: MLFLOW_REGISTRY_URI, else ``uri``) for the body."""
    with mlflow_settings_kept():
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(os.environ.get("MLFLOW_REGISTRY_URI") or uri)
        yield


@contextmanager
def active_run(run_id: str, tracking_uri: str) -> Iterator[None]:
    """``run_id`` as MLflow's active run for the body, where the models are logged; ended after."""
    with mlflow_pointed_at(tracking_uri), mlflow.start_run(run_id=run_id):
        yield


def load_pyfunc(uri: str, tracking_uri: str):
    """A logged or registered pyfunc model from the store at ``tracking_uri``."""
    import mlflow.pyfunc

    with mlflow_pointed_at(tracking_uri):
        return mlflow.pyfunc.load_model(uri)


def pyfunc_scores(model, prompts: list[str], responses: list[str]) -> list[float]:
    """A scoring pyfunc's predict on a (prompt, response) DataFrame -> one float per row."""
    out = model.predict(pd.DataFrame({"prompt": list(prompts), "response": list(responses)}))
    if isinstance(out, pd.DataFrame):
        out = out.iloc[:, 0]
    values = np.asarray(out, dtype=float).reshape(-1)
    if len(values) != len(prompts):
        raise ValueError(f"external scorer: {len(values)} scores for {len(prompts)} rows")
    return values.tolist()


def registered_alias_problem(uri: str, tracking_uri: str) -> str | None:
    """Why ``models:/<name>@<alias>`` names no version in the registry, or None."""
    from mlflow.store.db import utils as store_utils

    name, alias = uri.removeprefix("models:/").split("@", 1)
    quiet = logging.getLogger(store_utils.__name__)  # a new SQLite store says so
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        with mlflow_pointed_at(tracking_uri):
            if alias_version(MlflowClient(), name, alias) is not None:
                return None
            return (f"no version of registered model '{name}' holds alias '{alias}' in the "
                    f"registry at {mlflow.get_registry_uri()}")
    finally:
        quiet.setLevel(level)


def alias_holder(uri: str, tracking_uri: str) -> str:
    """``models:/<name>@<alias>`` as ``<name> v<N>``: the version the alias holds now."""
    name, alias = uri.removeprefix("models:/").split("@", 1)
    with mlflow_pointed_at(tracking_uri):
        return f"{name} v{alias_version(MlflowClient(), name, alias).version}"


def _log_code_model(name: str, script: str, folder: str, signature, registered: str,
                    trust_remote_code: bool, card: str | None = None, **artifacts: str) -> str:
    """Log (in the active run) and register the model in ``folder`` as code (``script`` beside
    this file), with ``artifacts`` -> its registered version. A LoRA adapter folder is logged
    as its self-contained bundle, which needs peft where served."""
    import mlflow.pyfunc

    from rlhf_core.models.adapters import bundle, is_adapter_folder

    with tempfile.TemporaryDirectory() as tmp:
        if card is not None:
            (Path(tmp) / "model_card.md").write_text(card)
            artifacts["model_card"] = str(Path(tmp) / "model_card.md")
        extra = []
        if is_adapter_folder(folder):
            out = bundle(folder, Path(tmp) / name)
            text = "\n".join(p.read_text() for p in out.rglob("rlhf_lora.json"))
            folder, extra = str(out), ["peft"] + (["gguf"] if ".gguf" in text else [])
        with warnings.catch_warnings():
            # the signature is explicit; an input example would run the model again at log time
            warnings.filterwarnings("ignore", message=".*input example was not provided")
            info = mlflow.pyfunc.log_model(
                name=name, python_model=str(Path(__file__).with_name(script)),
                artifacts={name: folder, **artifacts}, signature=signature,
                code_paths=[str(Path(rlhf_core.__file__).parent)], registered_model_name=registered,
                model_config={"trust_remote_code": trust_remote_code},
                pip_requirements=REQUIREMENTS + extra)
    return info.registered_model_version


def log_policy(policy_dir: str, name: str, generation: dict, card: str,
               trust_remote_code: bool = False) -> str:
    """Log (in the active run) and register the policy -> registered version; it takes a
    prompt (text or messages) and request params defaulting to ``generation``'s, and answers.
    ``card`` becomes ``model_card.md``."""
    params = ParamSchema([
        ParamSpec("max_new_tokens", "long", int(generation["max_new_tokens"])),
        ParamSpec("temperature", "double", float(generation["temperature"])),
        ParamSpec("top_p", "double", 1.0),
        ParamSpec("do_sample", "boolean", True),
        ParamSpec("seed", "long", None),
    ])
    signature = ModelSignature(inputs=Schema([ColSpec(AnyType(), "prompt")]),
                               outputs=Schema([ColSpec(AnyType())]), params=params)
    return _log_code_model("policy", "policy_pyfunc.py", policy_dir, signature, name,
                           trust_remote_code, card)


def log_reward_model(model_dir: str, tokenizer_dir: str, name: str,
                     trust_remote_code: bool = False) -> str:
    """Log (in the active run) and register the reward model -> registered version; it
    scores prompt, response (text, or messages)."""
    signature = ModelSignature(inputs=Schema([ColSpec(AnyType(), "prompt"),
                                              ColSpec(AnyType(), "response")]),
                               outputs=Schema([ColSpec("double")]))
    return _log_code_model("reward_model", "reward_pyfunc.py", model_dir, signature, name,
                           trust_remote_code, tokenizer=tokenizer_dir)
