"""MLflow model flavours for what ``transformers`` cannot carry: the scalar-head reward model
as a pyfunc that scores (prompt, response) pairs."""

from __future__ import annotations

from pathlib import Path

import mlflow.pyfunc
import pandas as pd

import rlhf_core


class RewardModelPyfunc(mlflow.pyfunc.PythonModel):
    """predict(DataFrame[prompt, response]) -> RM score of prompt + response + EOS."""

    def load_context(self, context) -> None:
        from rlhf_core.models import ScalarHeadModel, load_tokenizer

        self.model = ScalarHeadModel.load(context.artifacts["reward_model"]).eval()
        self.tokenizer = load_tokenizer(context.artifacts["tokenizer"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> list[float]:
        import torch

        from rlhf_core.reward import score_texts

        scores = score_texts(self.model, self.tokenizer, list(model_input["prompt"]),
                             list(model_input["response"]), torch.device("cpu"))
        return scores.tolist()


def log_reward_model(model_dir: str, tokenizer_dir: str, name: str) -> str:
    """Log (in the active run) and register the reward model -> registered version."""
    from mlflow.models import infer_signature

    example = pd.DataFrame({"prompt": ["a request"], "response": ["a reply"]})
    info = mlflow.pyfunc.log_model(
        name="reward_model", python_model=RewardModelPyfunc(),
        artifacts={"reward_model": model_dir, "tokenizer": tokenizer_dir},
        code_paths=[str(Path(rlhf_core.__file__).parent), __file__],
        signature=infer_signature(example, [0.0]), registered_model_name=name,
        pip_requirements=["torch", "transformers", "safetensors", "pandas"],
    )
    return info.registered_model_version
