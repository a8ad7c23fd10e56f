"""A stand-in for a strong independent scorer on the demo, registered as an MLflow pyfunc for
``ppo.health.scorer``: the demo's gold judge plus normal noise of a chosen size that depends
on the prompt and answer text alone (an answer that does not change keeps its score, as with
a real scorer). The gold judge's errors are its own, not the reward model's: this measures
the watch with a scorer that agrees with the gold judge as often as the noise allows, which no
scorer a user can train on the demo's pairs does (docs/benchmarks.md).

    python bench/health.py run --out DIR --scorer-noise 1   # every case scored by it
"""

from __future__ import annotations

import random
import sys
import zlib

import mlflow.pyfunc

NAME, ALIAS = "gold-noisy", "bench"
URI = f"models:/{NAME}@{ALIAS}"


class NoisyGold(mlflow.pyfunc.PythonModel):
    """prompt, response -> the demo gold judge's score + N(0, sigma) seeded by the text."""

    def __init__(self, sigma: float):
        self.sigma = sigma

    def predict(self, context, model_input, params=None):
        from rlhf_core.demo import judge_score

        out = []
        for prompt, response in zip(model_input["prompt"], model_input["response"]):
            rng = random.Random(zlib.crc32(f"{prompt}\x00{response}".encode()))
            out.append(float(judge_score(prompt, response, True)) + rng.gauss(0.0, self.sigma))
        return out


def register(tracking_uri: str, sigma: float) -> str:
    """Log and register the scorer in the store at ``tracking_uri`` (alias ``bench``) ->
    the ``models:/`` URI to give ``ppo.health.scorer``."""
    import cloudpickle
    from mlflow import MlflowClient

    from tasks.platform.mlflow.models import mlflow_pointed_at

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # loads without bench/
    with mlflow_pointed_at(tracking_uri):
        mlflow.set_experiment("scorers")
        with mlflow.start_run():
            info = mlflow.pyfunc.log_model(name="scorer", python_model=NoisyGold(sigma),
                                           registered_model_name=NAME)
    MlflowClient(tracking_uri).set_registered_model_alias(NAME, ALIAS,
                                                          info.registered_model_version)
    return URI
