"""The registered policy as a served model: `mlflow models serve` on a tiny chat model logged
by the project's own function answers a plain and a conversational request with the
completion only, honours the params, and refuses a bad request in one sentence. The same
pyfunc in process: the params schema, and a conversation sent to a model without a chat
template."""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.servers import free_port, stop, wait_until
from tests.tiny_chat import build_chat_model

CHAT = [{"role": "user", "content": "tell me about cats"}]
DEFAULTS = {"max_new_tokens": 6, "temperature": 0.7}


def _ping(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@contextmanager
def model_server(model_uri: str, tracking_uri: str, folder: Path):
    """``mlflow models serve`` of ``model_uri`` in this environment -> its URL."""
    port, log = free_port(), folder / "models-serve.log"
    bin_dir = str(Path(sys.executable).parent)  # `mlflow` and the `uvicorn` it execs
    proc = subprocess.Popen(
        [f"{bin_dir}/mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local",
         "-h", "127.0.0.1", "-p", str(port)], stdout=open(log, "w"), stderr=subprocess.STDOUT,
        env={**os.environ, "MLFLOW_TRACKING_URI": tracking_uri,
             "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ping(url), proc, log, "mlflow models serve", timeout_s=180)
        yield url
    finally:
        stop(proc)


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/invocations", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def greedy(model_dir: Path, text: str, n: int) -> str:
    """Reference: HF generate on the prompt alone, new tokens up to <|endoftext|>/<|im_end|>."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    stop_at = [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         do_sample=False, eos_token_id=stop_at, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.fixture(scope="module")
def registry(tmp_path_factory, tiny_model_dir):
    """A SQLite store with the tiny chat policy (champion) and the word-level demo-style
    policy (no chat template), both logged by tasks.platform.mlflow.models.log_policy."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from tasks.platform.mlflow.models import log_policy

    tmp = tmp_path_factory.mktemp("serving")
    chat_dir = build_chat_model(tmp / "chat")
    uri = f"sqlite:///{tmp}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment("serve", artifact_location=(tmp / "art").as_uri())
    with mlflow.start_run(experiment_id=exp):
        chat_v = log_policy(str(chat_dir), "chat-policy", DEFAULTS, "# tiny chat policy\n")
        log_policy(str(tiny_model_dir), "plain-policy", DEFAULTS, "# plain\n")
    MlflowClient(uri).set_registered_model_alias("chat-policy", "champion", chat_v)
    return uri, tmp, chat_dir


@pytest.fixture(scope="module")
def served(registry):
    uri, tmp, chat_dir = registry
    with model_server("models:/chat-policy@champion", uri, tmp) as url:
        yield url, chat_dir


def test_signature_carries_the_params_with_the_runs_defaults(registry):
    import mlflow

    mlflow.set_tracking_uri(registry[0])
    params = mlflow.pyfunc.load_model("models:/chat-policy@champion").metadata \
        .get_params_schema()
    assert {p.name: p.default for p in params.params} == {
        "max_new_tokens": 6, "temperature": 0.7, "top_p": 1.0, "do_sample": True, "seed": None}


def test_a_conversation_to_a_model_without_a_chat_template_is_one_sentence(registry):
    import mlflow
    from mlflow.exceptions import MlflowException

    mlflow.set_tracking_uri(registry[0])
    model = mlflow.pyfunc.load_model("models:/plain-policy/1")
    assert isinstance(model.predict(pd.DataFrame({"prompt": ["hello world"]}))[0], str)
    with pytest.raises(MlflowException) as err:
        model.predict(pd.DataFrame({"prompt": ["hello", CHAT]}))
    assert str(err.value) == ("row 1: 'prompt' is a list of messages, but this model's "
                              "tokenizer has no chat template; send it as plain text")


def greedy_answers(url: str, prompt) -> dict:
    """The served answers to ``prompt`` at max_new_tokens 2 and 12, greedy."""
    answers = {}
    for n in (2, 12):
        status, body = post(url, {"dataframe_records": [{"prompt": prompt}],
                                  "params": {"max_new_tokens": n, "do_sample": False}})
        assert status == 200, body
        [answers[n]] = body["predictions"]
    return answers


@pytest.mark.slow  # starts `mlflow models serve`
def test_served_plain_request_gets_the_completion_only(served):
    url, chat_dir = served
    prompt = "hello world , tell me"
    answers = greedy_answers(url, prompt)
    assert answers == {n: greedy(chat_dir, prompt, n) for n in (2, 12)}
    assert not answers[12].startswith(prompt.split()[0])
    assert answers[12].startswith(answers[2]) and len(answers[12]) > len(answers[2])


@pytest.mark.slow
def test_served_conversation_gets_the_assistant_message(served):
    url, chat_dir = served
    rendered = "<|im_start|>user\ntell me about cats<|im_end|>\n<|im_start|>assistant\n"
    answers = greedy_answers(url, CHAT)
    assert answers == {n: {"role": "assistant", "content": greedy(chat_dir, rendered, n)}
                       for n in (2, 12)}
    assert len(answers[2]["content"]) < len(answers[12]["content"])
    sampled = [post(url, {"inputs": {"prompt": [CHAT, "the rain"]},
                          "params": {"max_new_tokens": 12, "temperature": 1.0, "seed": s}})
               for s in (5, 5, 6)]
    assert all(status == 200 for status, _ in sampled), sampled
    first, again, other = (body["predictions"] for _, body in sampled)
    assert first == again != other and first[0]["role"] == "assistant"
    assert isinstance(first[1], str)


@pytest.mark.slow
def test_served_bad_request_is_refused_in_one_sentence(served):
    url, _ = served
    status, body = post(url, {"dataframe_records": [{"prompt": "hi"}, {"prompt": [{"x": 1}]}]})
    assert status == 400
    assert "row 1: 'prompt' must be text or a list of messages {role, content}" in \
        body["message"]
    status, body = post(url, {"dataframe_records": [{"prompt": "hi"}],
                              "params": {"top_p": 2.0}})
    assert status == 400 and "params: top_p must be in (0, 1], got 2.0" in body["message"]
    assert "Traceback" not in json.dumps(body)
