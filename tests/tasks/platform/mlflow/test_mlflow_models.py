"""The reward model as an MLflow model: registered, loadable by alias, scoring like the core,
and self-contained (loads where this repository's ``tasks`` package is not importable)."""

import json
import subprocess
import sys

import pandas as pd
import pytest
import torch

from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer
from rlhf_core.models.scoring import score_texts
from tests.shared import ROOT

PAIRS = pd.DataFrame({"prompt": ["hello world", "tell me about cats"],
                      "response": ["sure . thanks", "cats are nice !"]})

# Loads the model in a fresh interpreter with the editable install of this project hidden.
OUTSIDE = """
import json, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path[:] = [p for p in sys.path if "site-packages" in p or not p.startswith({root!r})]
import importlib.util
assert importlib.util.find_spec("tasks") is None, "tasks still importable"
import mlflow, pandas as pd
mlflow.set_tracking_uri({uri!r})
model = mlflow.pyfunc.load_model("models:/rm@challenger")
print(json.dumps(model.predict(pd.DataFrame({pairs}))))
"""


@pytest.fixture(scope="module")
def registered_rm(tmp_path_factory, tiny_model_dir):
    """A reward model logged and registered once for the tests below, which only read it."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from tasks.platform.mlflow.models import log_reward_model, mlflow_settings_kept

    tmp_path = tmp_path_factory.mktemp("registered_rm")
    torch.manual_seed(0)
    rm_dir = load_pretrained(tiny_model_dir, LoadSpec(), "new_head").save(tmp_path / "rm")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with mlflow_settings_kept():  # set up before, so outside, each test's own keeping
        mlflow.set_tracking_uri(uri)
        exp = mlflow.create_experiment("rm", artifact_location=(tmp_path / "art").as_uri())
        with mlflow.start_run(experiment_id=exp):
            version = log_reward_model(str(rm_dir), str(tiny_model_dir), "rm")
    MlflowClient(uri).set_registered_model_alias("rm", "challenger", version)
    expected = score_texts(load_pretrained(rm_dir, LoadSpec(), "scalar"),
                           load_tokenizer(str(tiny_model_dir)), list(PAIRS["prompt"]),
                           list(PAIRS["response"]), torch.device("cpu"))
    return uri, expected.tolist()


def test_registered_reward_model_scores_like_the_core(registered_rm):
    import mlflow

    uri, expected = registered_rm
    mlflow.set_tracking_uri(uri)
    scores = mlflow.pyfunc.load_model("models:/rm@challenger").predict(PAIRS)
    assert scores == pytest.approx(expected, abs=1e-5)
    assert scores[0] != pytest.approx(scores[1])


@pytest.mark.slow  # a fresh interpreter loading MLflow and the model
def test_reward_model_loads_without_this_repository(registered_rm, tmp_path):

    uri, expected = registered_rm
    root = str(ROOT)
    code = OUTSIDE.format(root=root, uri=uri, pairs=PAIRS.to_dict(orient="list"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == pytest.approx(expected, abs=1e-5)


CHAT = [{"role": "user", "content": "tell me about cats"}]
REPLY = {"role": "assistant", "content": "cats are nice"}


def test_a_conversation_to_a_reward_model_without_a_chat_template_is_one_sentence(
        registered_rm):
    import mlflow
    from mlflow.exceptions import MlflowException

    mlflow.set_tracking_uri(registered_rm[0])
    model = mlflow.pyfunc.load_model("models:/rm@challenger")
    with pytest.raises(MlflowException) as err:
        model.predict(pd.DataFrame({"prompt": ["hello", CHAT], "response": ["hi", REPLY]}))
    assert str(err.value) == ("row 1: 'prompt' is a list of messages, but this model's "
                              "tokenizer has no chat template; send it as plain text")
    with pytest.raises(MlflowException, match=r"Model is missing inputs \['response'\]"):
        model.predict(pd.DataFrame({"prompt": ["hello"]}))


def test_registered_reward_model_scores_conversations_at_the_end_of_turn(tmp_path):
    """Text and conversation rows in one request: the conversation is scored at the reply's
    <|im_end|> of the template's rendering, the text row as before."""
    import mlflow
    from transformers import AutoTokenizer

    from rlhf_core.models.scoring import score_padded
    from tasks.platform.mlflow.models import log_reward_model
    from tests.tiny_chat import build_chat_model

    chat_dir = build_chat_model(tmp_path / "chat")
    torch.manual_seed(0)
    rm_dir = load_pretrained(chat_dir, LoadSpec(), "new_head").save(tmp_path / "rm")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    exp = mlflow.create_experiment("rm", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=exp):
        version = log_reward_model(str(rm_dir), str(chat_dir), "chat-rm")
    scores = mlflow.pyfunc.load_model(f"models:/chat-rm/{version}").predict(pd.DataFrame(
        {"prompt": [CHAT, CHAT, "hello world"],
         "response": [REPLY, [REPLY], "sure . thanks"]}))

    tok, rm = AutoTokenizer.from_pretrained(chat_dir), load_pretrained(rm_dir, LoadSpec(), "scalar")
    text = tok.apply_chat_template(CHAT + [REPLY], tokenize=False)
    ids = tok(text[: text.rindex("<|im_end|>") + len("<|im_end|>")],
              add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        expected = score_padded(rm, torch.tensor([ids]), tok.pad_token_id).item()
    plain = score_texts(rm, tok, ["hello world"], ["sure . thanks"], torch.device("cpu"))
    assert scores == pytest.approx([expected, expected, plain.item()], abs=1e-5)
