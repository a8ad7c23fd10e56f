"""MLflow models for what ``transformers`` cannot carry: the scalar-head reward model, as a
pyfunc that scores (prompt, response) pairs (defined in ``tasks/reward_pyfunc.py``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

import rlhf_core

PYFUNC_SCRIPT = Path(__file__).with_name("reward_pyfunc.py")


def log_reward_model(model_dir: str, tokenizer_dir: str, name: str,
                     trust_remote_code: bool = False) -> str:
    """Log (in the active run) and register the reward model -> registered version."""
    import mlflow.pyfunc
    from mlflow.models import infer_signature

    example = pd.DataFrame({"prompt": ["a request"], "response": ["a reply"]})
    with warnings.catch_warnings():
        # the signature is given explicitly; an input example would load and run the reward
        # model once more at log time
        warnings.filterwarnings("ignore", message=".*input example was not provided")
        info = mlflow.pyfunc.log_model(
            name="reward_model", python_model=str(PYFUNC_SCRIPT),
            artifacts={"reward_model": model_dir, "tokenizer": tokenizer_dir},
            code_paths=[str(Path(rlhf_core.__file__).parent)],
            signature=infer_signature(example, [0.0]), registered_model_name=name,
            model_config={"trust_remote_code": trust_remote_code},
            pip_requirements=["torch", "transformers", "safetensors", "pandas"],
        )
    return info.registered_model_version
