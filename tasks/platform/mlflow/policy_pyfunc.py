"""The policy as an MLflow pyfunc logged as code, so serving it needs only this script, the
model folder and ``rlhf_core``, not this repository. Imported only by MLflow."""

import mlflow.pyfunc
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import set_model
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE


def request_prompts(model_input) -> list:
    """The prompts of a request, one per row, from any request shape MLflow serving sends
    (or, in Python, one prompt or a list of text prompts)."""
    from rlhf_core.eval.serving import RequestError

    if hasattr(model_input, "columns"):
        found = list(map(str, model_input.columns))
        if "prompt" not in found:
            raise RequestError(f"the request has no 'prompt' column (found: {', '.join(found)})")
        return list(model_input["prompt"])
    if isinstance(model_input, dict) and "prompt" in model_input:
        column = model_input["prompt"]
        one = isinstance(column, str) or (isinstance(column, list) and column and all(
            isinstance(m, dict) for m in column))  # text, or one list of messages
        return [column] if one else list(column)
    if isinstance(model_input, list) and model_input and all(
            isinstance(r, dict) and "prompt" in r for r in model_input):
        return [r["prompt"] for r in model_input]
    if isinstance(model_input, str | dict) or (
            isinstance(model_input, list) and model_input and isinstance(model_input[0], dict)):
        return [model_input]  # one prompt: text, a message or a list of messages
    return list(model_input)


class PolicyPyfunc(mlflow.pyfunc.PythonModel):
    """The registered policy: answers prompts with their completion only."""

    def load_context(self, context) -> None:
        from rlhf_core.eval.serving import load_served, stop_ids

        folder = context.artifacts["policy"]  # weights, config and tokenizer
        self.model, self.tokenizer = load_served("policy", folder, folder, context.model_config)
        self.stop = stop_ids(self.model, self.tokenizer)

    def predict(self, context, model_input: pd.DataFrame, params=None) -> list:
        from rlhf_core.eval.serving import GenerationSettings, RequestError, answer_rows

        params = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            settings = GenerationSettings(**params)
            return answer_rows(self.model, self.tokenizer, request_prompts(model_input),
                               settings, self.stop)
        except (RequestError, TypeError) as err:  # TypeError: a param missing or unknown
            raise MlflowException(str(err), error_code=INVALID_PARAMETER_VALUE) from None


set_model(PolicyPyfunc())
