"""The policy as an MLflow pyfunc, logged as *code* (MLflow's models-from-code), like the
reward model: the registry stores this script, the policy's Hugging Face folder (weights,
config, tokenizer) and ``rlhf_core`` (code_paths), so serving it needs neither this repository
nor its ``tasks`` package. Imported only by MLflow; ``tasks/platform/mlflow/models.py`` logs it.

predict(DataFrame[prompt]) -> one answer per row, the completion only: text for a text
prompt, ``{"role": "assistant", "content": ...}`` for a list of messages (rendered with the
tokenizer's chat template). The request's ``params`` (max_new_tokens, temperature, top_p,
do_sample, seed) arrive filled with the signature's defaults (the run's evaluation settings).
"""

import mlflow.pyfunc
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import set_model
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE


def request_prompts(model_input) -> list:
    """The prompts of a request, one per row: a DataFrame's ``prompt`` column (served
    ``dataframe_records`` / ``dataframe_split``), a column ``{"prompt": [...]}`` (served
    ``inputs``; a list of messages there is one conversation), records
    ``[{"prompt": ...}]`` (``instances``), or in Python one prompt (text or messages) or a
    list of text prompts."""
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
    """The registered policy: answers prompts with their completion only. ``model_input`` is
    a DataFrame when served; in Python it may be any form :func:`request_prompts` reads."""

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
