"""PPO's reward sources beside the reward model (``ppo.reward_sources``; the math in
rlhf_core/ppo/rewards.py): a ``module:function``, a registered MLflow pyfunc, or an MLflow
scoring server over HTTP, each checked before training and recorded with what identifies it.
A function is called as TRL calls reward functions, ``fn(prompts=..., completions=...,
**columns)`` -> a float or None (abstain) per row. Imports nothing heavy: the CLI uses it."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.config.pipeline_config import ConfigError
from tasks.platform.redact import redact

if TYPE_CHECKING:
    from rlhf_core.config import PPOConfig, RewardSource
    from rlhf_core.ppo.rewards import RewardMix


class RewardSourceDown(Exception):  # noqa: N818 - a stop, named after its cause
    """A served reward model down after its retries: the run stops, resumable."""

    stops_run = True

    def __init__(self, message: str, reason: object = None):
        super().__init__(message)
        self.reason = reason


def load_function(source: RewardSource) -> Callable:
    """The function ``module:function`` (the working directory importable too)."""
    module_name, name = source.target.split(":")
    where = f"ppo.reward_sources[{source.name}]: {source.target}"
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise ConfigError(f"{where}: cannot import {module_name} ({type(err).__name__}: "
                          f"{err})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"{where}: {module_name} has no function {name}")
    return fn


def function_digest(fn: Callable) -> str:
    """sha256 of the file that defines ``fn`` (its first 12 hex digits)."""
    path = inspect.getsourcefile(fn)
    return "unknown" if path is None else hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def post_rows(source: RewardSource, prompts: Sequence[Any], responses: Sequence[str],
              sleep: Callable[[float], None] = time.sleep) -> list[float | None]:
    """The served model's score per (prompt, response) row; 5xx or no answer is retried
    with backoff, then :class:`RewardSourceDown`; a 4xx fails at once."""
    rows = [[p, r] for p, r in zip(prompts, responses)]
    body = json.dumps({"dataframe_split": {"columns": ["prompt", "response"], "data": rows}})
    request = _request(source.target, body.encode())
    error: Exception | None = None
    for attempt in range(source.retries + 1):
        if attempt:
            sleep(2.0 ** (attempt - 1))
        try:
            with urllib.request.urlopen(request, timeout=source.timeout_s) as answer:
                return predictions(json.loads(answer.read()))
        except urllib.error.HTTPError as err:
            if err.code < 500:
                raise ValueError(f"{redact(source.target)} refused the request: HTTP "
                                 f"{err.code} {err.read()[:300].decode(errors='replace')}"
                                 ) from None
            error = err
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            error = err
    tries = f"{source.retries + 1} tries" if source.retries else "1 try"
    raise RewardSourceDown(f"reward source {source.name!r}: {redact(source.target)} did not "
                           f"answer after {tries} ({error}); nothing saved was lost", error)


def _request(url: str, body: bytes) -> urllib.request.Request:
    """A JSON POST; a login in the URL goes in a basic-auth header (urllib ignores it)."""
    import base64
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    headers = {"Content-Type": "application/json"}
    if parts.username is not None:
        login = f"{parts.username}:{parts.password or ''}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(login).decode()
        host = parts.hostname + (f":{parts.port}" if parts.port else "")
        url = urlunsplit(parts._replace(netloc=host))
    return urllib.request.Request(url, data=body, headers=headers)


def predictions(answer: Any) -> list[float | None]:
    """MLflow's scoring answer -> one score or None per row."""
    rows = answer.get("predictions", answer) if isinstance(answer, dict) else answer
    if not isinstance(rows, list):
        raise ValueError(f"expected a list of predictions, got {type(rows).__name__}")
    return [next(iter(r.values()), None) if isinstance(r, dict) else r for r in rows]


def server_problem(source: RewardSource) -> str | None:
    """Why the served model cannot be reached (None: it answered a one-row request)."""
    try:
        post_rows(source.model_copy(update={"retries": 0}), ["ping"], ["pong"])
    except RewardSourceDown as err:
        return f"{redact(source.target)} does not answer ({err.reason})"
    except ValueError:
        return None  # it answers (it refused the probe row, not the connection)
    return None


def check_reward_sources(cfg: PPOConfig, tracking_uri: str) -> dict[str, str]:
    """Check each source (ConfigError naming it) -> name: its settings, then in brackets
    what they resolve to now (file digest, alias version)."""
    out = {}
    for source in cfg.reward_sources:
        named = redact(source.target) or "the run's reward model"
        settings = f"{source.kind} {named}, weight {source.weight}"
        resolved = ""
        if source.kind == "function":
            resolved = f"sha256 {function_digest(load_function(source))}"
        elif source.kind == "registered":
            from tasks.platform.mlflow.models import alias_holder, registered_alias_problem

            problem = registered_alias_problem(source.target, tracking_uri)
            if problem is not None:
                raise ConfigError(f"ppo.reward_sources[{source.name}]: {problem}")
            resolved = alias_holder(source.target, tracking_uri)
        elif source.kind == "http" and (problem := server_problem(source)) is not None:
            raise ConfigError(f"ppo.reward_sources[{source.name}]: {problem}")
        out[source.name] = settings + (f" [{resolved}]" if resolved else "")
    return out


def changed_sources(before: dict[str, str], now: dict[str, str]) -> tuple[list[str], list[str]]:
    """Source descriptions at first try and at resume -> (same settings resolving to
    something else, which a resume must not train on; settings changed on purpose)."""
    moved, reset = [], []
    for name, text in now.items():
        old = before.get(name)
        if old is None or old == text:
            continue
        same = old.split(" [")[0] == text.split(" [")[0]
        (moved if same else reset).append(f"{name} was {old!r}, now {text!r}")
    return moved, reset


def reward_mix(cfg: PPOConfig, prompt_rows: Sequence[dict], tracking_uri: str) -> RewardMix:
    """``cfg``'s sources as a :class:`RewardMix`; text scorers read ``prompt_rows`` by index."""
    from rlhf_core.ppo.rewards import RewardMix, TextScorer

    model = cfg.reward_model_source
    scorers = tuple(TextScorer(s.name, s.weight, _scorer(s, prompt_rows, tracking_uri))
                    for s in cfg.reward_sources if s.kind != "model")
    return RewardMix(model_name=model.name if model else None,
                     model_weight=model.weight if model else 1.0, scorers=scorers,
                     aggregation=cfg.reward_aggregation)


def _scorer(source: RewardSource, prompt_rows: Sequence[dict], tracking_uri: str):
    """(texts, rows) -> scores, for one text source."""
    if source.kind == "function":
        fn = load_function(source)

        def call(texts: list[str], rows: list[int]):
            picked = [prompt_rows[i] for i in rows]
            columns = {k: [r.get(k) for r in picked] for k in picked[0] if k != "prompt"}
            return fn(prompts=[r["prompt"] for r in picked], completions=texts, **columns)
        return call
    if source.kind == "registered":
        from tasks.platform.mlflow.models import load_pyfunc

        model = load_pyfunc(source.target, tracking_uri)

        def predict(texts: list[str], rows: list[int]):
            import pandas as pd

            frame = pd.DataFrame({"prompt": [prompt_rows[i]["prompt"] for i in rows],
                                  "response": texts})
            out = model.predict(frame)
            return list(out.iloc[:, 0] if isinstance(out, pd.DataFrame) else out)
        return predict
    return lambda texts, rows: post_rows(source, [prompt_rows[i]["prompt"] for i in rows], texts)
