"""Checks made before Prefect or MLflow start, so a mistake is a one-sentence ConfigError
naming the field or URL and the fix, not a traceback mid-run."""

from __future__ import annotations

import os
import re
import socket
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from data_checks.files import looks_local
from tasks.config.pipeline_config import ConfigError, PipelineConfig
from tasks.platform.mlflow.addresses import tracking_source
from tasks.platform.prefect.logins import Needs, check_mlflow_login, check_prefect_login


class RoutingError(ValueError):
    """A routing setting that cannot work, raised before any run is opened."""


def check_model_source(field: str, value: str | None) -> None:
    if not value:
        return
    from rlhf_core.models.sources import PACKAGE_PREFIX, ModelSourceError, gguf_file

    try:  # a GGUF file, a package's file, or a folder holding one GGUF file
        if gguf_file(value) is not None:
            return
    except ModelSourceError as err:
        raise ConfigError(f"{field}={err}") from None
    if value.startswith(PACKAGE_PREFIX):
        raise ConfigError(f"{field}={value}: not a .gguf file; a package's file is read as "
                          "a GGUF model (give a folder path for any other model)")
    if looks_local(value):
        path = Path(value).expanduser()
        if not path.is_dir():
            what = "is a file, not a model folder" if path.exists() else "does not exist"
            raise ConfigError(f"{field}={value}: the folder {what}. Give a local model folder "
                              "(with config.json), a .gguf file or a hub id such as 'gpt2' "
                              "or 'EleutherAI/pythia-160m'.")
        if field == "model.base_model" and not (path / "config.json").exists():
            raise ConfigError(f"{field}={value}: no config.json in the folder, so it is not a "
                              "Hugging Face model folder (save one with save_pretrained).")
    elif not re.match(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$", value):  # a hub id
        raise ConfigError(f"{field}={value!r}: neither an existing local folder nor a hub id "
                          "of the form 'name' or 'owner/name'.")


def check_config(cfg: PipelineConfig) -> None:
    """Config-level checks that need no run (data present, model, workdir)."""
    if cfg.data is None and not cfg.demo.enabled:
        raise ConfigError("no data: the config has neither a `data:` section (sft, preference, "
                          "prompts) nor `demo.enabled: true`. Add one of them.")
    if not cfg.demo.enabled and not cfg.model.base_model:
        raise ConfigError("no base model: set model.base_model to a local model folder or a "
                          "hub id (or demo.enabled: true for the built-in tiny model).")
    check_model_source("model.base_model", cfg.model.base_model)
    check_model_source("model.tokenizer", cfg.model.tokenizer)
    # model.device=cuda where torch sees no CUDA fails here, not inside a stage (unless the
    # stages run on other machines)
    if cfg.model.device == "cuda" and not (cfg.routing.stages or cfg.routing.nodes):
        import torch

        if not torch.cuda.is_available():
            why = "was built without CUDA" if torch.version.cuda is None else "sees no CUDA device"
            here = "mps" if torch.backends.mps.is_available() else "cpu"
            raise ConfigError(f"model.device=cuda: this machine's torch {torch.__version__} {why}; "
                              f"the device here is {here}, so set model.device={here} (or auto), "
                              "or install a CUDA build of torch on a machine with a GPU.")
    problem = folder_problem(Path(cfg.tracking.workdir).expanduser())
    if problem:
        raise ConfigError(f"tracking.workdir={cfg.tracking.workdir}: {problem}. Point it at a "
                          "folder you can write (it is created if missing).")


def folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be created and written as a folder, else None (leaves nothing)."""
    if path.exists() and not path.is_dir():
        return "is a file, not a folder"
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rlhf-probe-", dir=existing))
    except OSError as err:
        return f"cannot create a folder in {existing} ({err.strerror or err})"
    return None


TIMEOUT_S = 5.0


def no_answer(url: str, timeout_s: float) -> str | None:
    """Why ``url`` gives no usable HTTP answer in one try (a 4xx is one, a 5xx not), else None."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}" if err.code >= 500 else None
    except urllib.error.URLError as err:
        reason = err.reason
        return "no answer" if isinstance(reason, TimeoutError) else str(
            getattr(reason, "strerror", None) or reason)
    except TimeoutError:
        return "no answer"
    except (OSError, ValueError) as err:
        return str(err)


def _store_problem(uri: str, timeout_s: float) -> tuple[str, str, str] | None:
    """(what it is, what is wrong, what to check) for the MLflow store, else None."""
    parsed = urllib.parse.urlsplit(uri)
    scheme = parsed.scheme
    tried = f"one try of up to {timeout_s:g} s"
    if scheme in ("http", "https"):
        why = no_answer(f"{uri.rstrip('/')}/health", timeout_s)
        return ("the MLflow tracking server at", f"does not answer ({why}; {tried})",
                "that `mlflow server` runs there and the URL is right") if why else None
    if scheme in ("", "file", "sqlite"):
        path = Path(uri.removeprefix("sqlite:///").removeprefix("file://")).expanduser()
        folder = path.parent if scheme == "sqlite" else path
        problem = folder_problem(folder)
        return ("the MLflow store", f"cannot be used: its folder {folder}: {problem}",
                "the path and its permissions") if problem else None
    if scheme == "databricks" or not parsed.hostname:
        return None
    port = parsed.port or {"postgresql": 5432, "mysql": 3306, "mssql": 1433}.get(
        scheme.split("+")[0])
    if port is None:
        return None
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
        return None
    except OSError as err:
        why = "no answer" if isinstance(err, TimeoutError) else str(err.strerror or err)
    return ("the MLflow store's database at", f"does not answer ({why}; {tried})",
            "that the database server runs there and the URI is right") if why else None


def prefect_api_url() -> tuple[str | None, str]:
    """PREFECT_API_URL and where it came from; None means Prefect's local ephemeral API."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"], "PREFECT_API_URL"
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value(), "PREFECT_API_URL in the active Prefect profile"


def check_servers(tracking_uri: str | None = None, *, mlflow: bool = True,
                  prefect: bool = True, timeout_s: float = TIMEOUT_S,
                  needs: Needs | None = None) -> None:
    """One try each: the MLflow store and (``prefect``) Prefect API answer and take the login."""
    if mlflow:
        uri, source = tracking_source(tracking_uri)
        problem = _store_problem(uri, timeout_s)
        if problem:
            what, wrong, check = problem
            raise ConfigError(f"{what} {uri} (from {source}) {wrong}; check {check}, or point "
                              "MLFLOW_TRACKING_URI / tracking.tracking_uri at another store.")
        check_mlflow_login(uri, source, needs, timeout_s)
    if prefect:
        url, source = prefect_api_url()
        why = no_answer(f"{url.rstrip('/')}/health", timeout_s) if url else None
        if why:
            raise ConfigError(f"the Prefect API at {url} (from {source}) does not answer "
                              f"({why}; one try of up to {timeout_s:g} s); check that "
                              "`prefect server start` runs there and the URL ends in /api, "
                              "or unset PREFECT_API_URL to use a local temporary API.")
        if url:
            check_prefect_login(url, source, timeout_s)
