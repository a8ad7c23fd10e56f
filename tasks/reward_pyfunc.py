"""The reward model as an MLflow pyfunc, logged as *code* (MLflow's models-from-code): the
registry stores this script, the safetensors checkpoint and ``rlhf_core`` (code_paths), so
loading it unpickles nothing and needs neither this repository nor its ``tasks`` package.
Imported only by MLflow, at log and load time; ``tasks/mlflow_models.py`` logs it."""

import mlflow.pyfunc
import pandas as pd
from mlflow.models import set_model


class RewardModelPyfunc(mlflow.pyfunc.PythonModel):
    """predict(DataFrame[prompt, response]) -> RM score of prompt + response + EOS."""

    def load_context(self, context) -> None:
        from rlhf_core.loader import LoadSpec, load_scalar_model, load_tokenizer

        trust = bool((context.model_config or {}).get("trust_remote_code", False))
        spec = LoadSpec(trust_remote_code=trust)  # float32 on CPU, as served
        self.model = load_scalar_model(context.artifacts["reward_model"], spec, trainable=False)
        self.tokenizer = load_tokenizer(context.artifacts["tokenizer"], spec)

    def predict(self, context, model_input: pd.DataFrame, params=None) -> list[float]:
        import torch

        from rlhf_core.scoring import score_texts

        scores = score_texts(self.model, self.tokenizer, list(model_input["prompt"]),
                             list(model_input["response"]), torch.device("cpu"))
        return scores.tolist()


set_model(RewardModelPyfunc())
