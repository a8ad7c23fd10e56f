"""Logins to shared MLflow and Prefect servers, checked before anything starts: both answer
``/health`` without one, so the command's own look-ups are tried first, read-only, and a refusal
is a one-sentence ConfigError instead of a traceback mid-run. A login in the tracking URI is
moved into MLflow's variables so nothing records it."""

from __future__ import annotations

import base64
import configparser
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tasks.config.pipeline_config import ConfigError

USER_VAR, PASSWORD_VAR, TOKEN_VAR = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                                     "MLFLOW_TRACKING_TOKEN")
AUTH_STRING_VAR, API_KEY_VAR = "PREFECT_API_AUTH_STRING", "PREFECT_API_KEY"


@dataclass(frozen=True)
class Needs:
    """What a command will do on the MLflow server (``managed`` models: MANAGE, not just EDIT)."""

    experiment: str | None = None
    write: bool = True
    models: tuple[str, ...] = ()
    managed: tuple[str, ...] = ()


def needs_of(cfg) -> Needs:
    """A pipeline command's experiment, and its registered models when it registers them."""
    t = cfg.tracking
    models = (t.registered_policy, t.registered_reward_model) if t.register_models else ()
    return Needs(t.experiment, models=models)


def split_login(uri: str) -> tuple[str, str | None, str | None]:
    """``http://bob:secret@host:5000/x`` -> (``http://host:5000/x``, 'bob', 'secret')."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or parts.password is None:
        return uri, None, None
    bare = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    return bare, urllib.parse.unquote(parts.username or ""), \
        urllib.parse.unquote(parts.password or "")


# where each field that may hold a URI is better given (never recorded anywhere)
SECRET_HOMES = {"tracking.tracking_uri": "MLFLOW_TRACKING_URI",
                "collect.destination.url": "LABEL_STUDIO_URL"}


def login_out_of_uri(cfg=None):
    """Move a login in the tracking URI (config or $MLFLOW_TRACKING_URI) into MLflow's user and
    password variables, so nothing recorded carries it -> ``cfg`` with the bare URI. Any other
    config URL with a password is refused: as a flow-run parameter it would reach Prefect's UI."""
    from tasks.config.pipeline_config import flatten
    from tasks.platform.redact import URL_LOGIN, redact

    bare, user, password = split_login(os.environ.get("MLFLOW_TRACKING_URI", ""))
    if user:
        os.environ.update({"MLFLOW_TRACKING_URI": bare, USER_VAR: user, PASSWORD_VAR: password})
    if cfg is None:
        return cfg
    bare, user, password = split_login(cfg.tracking.tracking_uri or "")
    if user:
        os.environ.update({USER_VAR: user, PASSWORD_VAR: password})
        tracking = cfg.tracking.model_copy(update={"tracking_uri": bare})
        cfg = cfg.model_copy(update={"tracking": tracking})
    for field, value in flatten(cfg.model_dump(mode="json")).items():
        if isinstance(value, str) and URL_LOGIN.search(value):  # what no variable can take
            home = SECRET_HOMES.get(field)
            where = (f"set {home} to it instead (read from the environment, never recorded) "
                     f"and leave {field} empty" if home else
                     "give the password to the tool through its environment instead")
            raise ConfigError(f"{field} holds a password ({redact(value)}), which would be "
                              f"stored with the run's parameters: {where}")
    return cfg


def mlflow_credentials() -> tuple[dict[str, str], str | None, str]:
    """(headers, user name, what was read) as the MLflow client sends them: a user and
    password (variables, else ~/.mlflow/credentials), else a token."""
    token = os.environ.get(TOKEN_VAR)
    user, password = os.environ.get(USER_VAR), os.environ.get(PASSWORD_VAR)
    read = f"{USER_VAR}/{PASSWORD_VAR}"
    path = Path("~/.mlflow/credentials").expanduser()
    if not (user and password) and path.is_file():
        parser = configparser.ConfigParser()
        parser.read(path)
        section = parser["mlflow"] if parser.has_section("mlflow") else {}
        user = user or section.get(USER_VAR.lower())
        password = password or section.get(PASSWORD_VAR.lower())
        read = f"{USER_VAR}/{PASSWORD_VAR} (with {path})"
    if user and password:
        basic = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {basic}"}, user, read
    if token:
        return {"Authorization": f"Bearer {token}"}, None, TOKEN_VAR
    return {}, None, ""


def _get(url: str, headers: dict[str, str], timeout_s: float) -> tuple[int, dict | None]:
    """(HTTP status, JSON body or None) of one GET; status 0 when no answer came."""
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read()
    except (OSError, ValueError):  # URLError, a timeout, a reset connection
        return 0, None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


class _Mlflow:
    """The read-only calls of the check, each one try of at most ``timeout_s``."""

    def __init__(self, uri: str, source: str, timeout_s: float):
        self.uri, self.timeout_s = uri.rstrip("/"), timeout_s
        self.headers, self.user, self.read = mlflow_credentials()
        self.where = f"the MLflow server at {uri} (from {source})"

    def get(self, path: str, **query: str) -> tuple[int, dict | None]:
        url = f"{self.uri}/api/{path}?{urllib.parse.urlencode(query)}"
        status, body = _get(url, self.headers, self.timeout_s)
        if status == 401 and not self.read:
            raise ConfigError(f"{self.where} asks for a login and none was given (HTTP 401): "
                              f"set {USER_VAR} and {PASSWORD_VAR} (or {TOKEN_VAR}) to your "
                              "login on it.")
        if status == 401:
            who = f" of user '{self.user}'" if self.user else ""
            raise ConfigError(f"{self.where} refused the login{who} read from {self.read} "
                              "(HTTP 401 Unauthorized); check the user name and password (or "
                              "token) with the server's admin.")
        return status, body

    def permission(self, kind: str, name: str) -> str | None:
        """The user's permission level on a resource as the auth app resolves it."""
        status, body = self.get("3.0/mlflow/users/permissions/get", username=self.user,
                                resource_type=kind, resource_id=name)
        return (body or {}).get("permission") if status == 200 else None


def check_mlflow_login(uri: str, source: str, needs: Needs | None, timeout_s: float) -> None:
    """Check ``uri`` takes the MLflow login and, with ``needs``, allows what the command does."""
    if urllib.parse.urlsplit(uri).scheme not in ("http", "https"):
        return
    server = _Mlflow(uri, source, timeout_s)
    status, body = server.get("2.0/mlflow/users/current")
    auth_app = status == 200 and isinstance(body, dict) and "user" in body
    if auth_app:
        server.user = body["user"].get("username") or server.user
    admin = auth_app and bool(body["user"].get("is_admin"))
    needs, levels = needs or Needs(), auth_app and not admin
    if needs.experiment:
        _check(server, "experiment", needs.experiment, levels, needs.write)
    for name in needs.models:
        _check(server, "registered_model", name, levels, manage=name in needs.managed)


def _forbidden(server: _Mlflow, what: str, has: str | None, needs: str) -> ConfigError:
    """A missing permission: the level the app reports (``has``), else a 403 on reading."""
    has = f"has {has} on" if has else "may not read (HTTP 403 Permission denied)"
    return ConfigError(f"{server.where}: user '{server.user}' {has} {what}, and this command "
                       f"needs {needs}; ask the server's admin to grant it, or use a login "
                       "that has it.")


def _check(server: _Mlflow, kind: str, name: str, levels: bool, write: bool = True,
           manage: bool = False) -> None:
    """May the user read (``write``: change) the experiment or registered model ``name``?
    ``levels``: the auth app reports the user's levels (not an admin)."""
    model, what = kind == "registered_model", f"the {kind.replace('_', ' ')} '{name}'"
    status, body = server.get("2.0/mlflow/registered-models/get", name=name) if model else \
        server.get("2.0/mlflow/experiments/get-by-name", experiment_name=name)
    if status == 403:
        edit = "EDIT (to register versions and set aliases)" if model else "EDIT (to log runs)"
        raise _forbidden(server, what, None, edit if write else "READ")
    if not levels or not write:
        return
    if status == 404:  # created by the run: the app lets a user create unless denied
        level = server.permission(kind, "*")
        if level in ("DENY", "NO_PERMISSIONS"):
            raise _forbidden(server, f"new {kind.replace('_', ' ')}s", level,
                             f"to create {what} (it does not exist yet)")
    elif status == 200:
        rid = name if model else body["experiment"]["experiment_id"]
        level = server.permission(kind, rid)
        if manage and level and level != "MANAGE":
            raise _forbidden(server, what, level, "MANAGE (to move and remove its aliases, "
                             "as approving or rejecting a candidate does)")
        if level and level not in ("EDIT", "MANAGE"):  # the levels that may log and register
            raise _forbidden(server, what if model else f"{what} (id {rid})", level,
                             "EDIT (to register versions of it and set its aliases)" if model
                             else "EDIT (to log runs in it)")


def _profile_value(name: str) -> str | None:
    """The active profile's Prefect setting ``name`` (named as its variable), unwrapped."""
    import prefect.settings

    value = getattr(prefect.settings, name).value()
    return value.get_secret_value() if hasattr(value, "get_secret_value") else value


def check_prefect_login(url: str, source: str, timeout_s: float) -> None:
    """Check the Prefect API takes the login via GET /admin/version (which needs one), sent as
    Prefect's client does: the auth string, else the API key, from the variables or profile."""
    version = f"{url.rstrip('/')}/admin/version"
    status, _ = _get(version, {}, timeout_s)
    if status not in (401, 403):
        return
    auth, key, profile = os.environ.get(AUTH_STRING_VAR), os.environ.get(API_KEY_VAR), ""
    if not (auth or key):
        auth, key = _profile_value(AUTH_STRING_VAR), _profile_value(API_KEY_VAR)
        profile = " in the active Prefect profile"
    read = f"{AUTH_STRING_VAR}{profile}" if auth else f"{API_KEY_VAR}{profile}" if key else ""
    if auth or key:
        login = f"Basic {base64.b64encode(auth.encode()).decode()}" if auth else f"Bearer {key}"
        status, _ = _get(version, {"Authorization": login}, timeout_s)
    where = f"the Prefect API at {url} (from {source})"
    if status not in (401, 403):
        return
    if not read:
        raise ConfigError(f"{where} asks for a login and none was given (HTTP {status}): set "
                          f"{AUTH_STRING_VAR} to the server's PREFECT_SERVER_API_AUTH_STRING "
                          f"(or {API_KEY_VAR} for Prefect Cloud).")
    why = "Unauthorized" if status == 401 else "Forbidden"
    raise ConfigError(f"{where} refused the login read from {read} (HTTP {status} {why}); "
                      f"check it against the server's PREFECT_SERVER_API_AUTH_STRING (or "
                      "the API key's access).")


def login_name(first: str = "mlflow") -> str:
    """Who acts, for an approval: the MLflow or Prefect login (``first`` first), else OS user."""
    import getpass

    auth = os.environ.get(AUTH_STRING_VAR) or _profile_value(AUTH_STRING_VAR)
    prefect = auth.split(":", 1)[0] if auth and ":" in auth else None
    mlflow = mlflow_credentials()[1]
    names = (prefect, mlflow) if first == "prefect" else (mlflow, prefect)
    return next((n for n in names if n), None) or getpass.getuser()
