"""The reward model as an MLflow pyfunc, logged as *code* (MLflow's models-from-code): the
registry stores this script, the safetensors checkpoint and ``rlhf_core`` (code_paths), so
loading it unpickles nothing and needs neither this repository nor its ``tasks`` package.
Imported only by MLflow, at log and load time; ``tasks/platform/mlflow/models.py`` logs it.

predict(DataFrame[prompt, response]) -> one score per row: of prompt + response + EOS for
text, or of the conversation rendered by the tokenizer's chat template, read at the reply's
end-of-turn token, when the prompt is a list of messages (the response then is text, an
assistant message, or a list of messages).
"""

import mlflow.pyfunc
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import set_model
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE


class RewardModelPyfunc(mlflow.pyfunc.PythonModel):
    """predict(DataFrame[prompt, response]) -> the reward model's score of each row."""

    def load_context(self, context) -> None:
        from rlhf_core.eval.serving import load_served

        self.model, self.tokenizer = load_served("reward", context.artifacts["reward_model"],
                                                 context.artifacts["tokenizer"],
                                                 context.model_config)

    def predict(self, context, model_input: pd.DataFrame, params=None) -> list[float]:
        from rlhf_core.eval.serving import RequestError, score_rows

        try:  # a missing column is refused by MLflow's schema check, before this
            return score_rows(self.model, self.tokenizer, list(model_input["prompt"]),
                              list(model_input["response"]))
        except RequestError as err:
            raise MlflowException(str(err), error_code=INVALID_PARAMETER_VALUE) from None


set_model(RewardModelPyfunc())
