"""The reward model as an MLflow pyfunc logged as code, so loading it unpickles nothing and
needs only this script, the checkpoint and ``rlhf_core``. Imported only by MLflow."""

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
