"""Label Studio's REST API over the standard library. Server and key come from
``LABEL_STUDIO_URL`` (else ``collect.destination.url``) and ``LABEL_STUDIO_API_KEY``, never
written anywhere. A personal access token (a JWT) is exchanged for short-lived access tokens; a
legacy key goes in a ``Token`` header."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

URL_VAR, KEY_VAR = "LABEL_STUDIO_URL", "LABEL_STUDIO_API_KEY"
TIMEOUT_S = 30.0


class LabelStudioError(Exception):
    """Label Studio could not be used: unreachable, a refused key, a missing project."""


class NotFound(LabelStudioError):
    """The object asked for is not (or no longer) on the server."""


def _detail(err: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(err.read() or b"{}")
    except ValueError:
        return err.reason or ""
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("validation_errors") or body)[:300]
    return str(body)[:300]


class LabelStudio:
    """One Label Studio server and one API key."""

    def __init__(self, url: str, key: str, timeout_s: float = TIMEOUT_S):
        self.url, self._key, self.timeout_s = url.rstrip("/"), key, timeout_s
        self._personal = key.startswith("eyJ") and key.count(".") == 2  # a JWT
        self._access: str | None = None

    @classmethod
    def from_env(cls, configured_url: str | None = None,
                 timeout_s: float = TIMEOUT_S) -> LabelStudio:
        """``LABEL_STUDIO_URL`` (else the config's url) and ``LABEL_STUDIO_API_KEY``."""
        url = os.environ.get(URL_VAR) or configured_url
        if not url:
            raise LabelStudioError(f"no Label Studio server: set {URL_VAR} (e.g. "
                                   "http://127.0.0.1:8080) or collect.destination.url")
        url = url.rstrip("/")
        key = os.environ.get(KEY_VAR, "").strip()
        if not key:
            raise LabelStudioError(
                f"{KEY_VAR} is not set: copy a personal access token from Label Studio's "
                f"Account & Settings page at {url} and export it as {KEY_VAR}")
        return cls(url, key, timeout_s)

    # --- transport -----------------------------------------------------------------------
    def _send(self, method: str, path: str, body: Any, headers: dict[str, str]) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              "Accept": "application/json", **headers})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            reason = getattr(err, "reason", err)
            why = "no answer" if isinstance(reason, TimeoutError) else str(
                getattr(reason, "strerror", None) or reason)
            raise LabelStudioError(
                f"Label Studio at {self.url} does not answer ({why}); check that "
                f"`label-studio start` runs there and that {URL_VAR} is right") from None
        return json.loads(raw) if raw.strip() else None

    def _auth(self) -> dict[str, str]:
        if not self._personal:
            return {"Authorization": f"Token {self._key}"}
        if self._access is None:
            try:
                out = self._send("POST", "/api/token/refresh/", {"refresh": self._key}, {})
            except urllib.error.HTTPError as err:
                raise LabelStudioError(
                    f"Label Studio at {self.url} refused the personal access token in "
                    f"{KEY_VAR} (HTTP {err.code}: {_detail(err)}); it may have been revoked "
                    "or made on another server: copy a new one from Account & Settings"
                ) from None
            self._access = out["access"]
        return {"Authorization": f"Bearer {self._access}"}

    def call(self, method: str, path: str, body: Any = None, *, what: str = "") -> Any:
        """One API call -> its JSON; an access token that expired is renewed once."""
        for attempt in (0, 1):
            try:
                return self._send(method, path, body, self._auth())
            except urllib.error.HTTPError as err:
                if err.code == 401 and attempt == 0 and self._personal:
                    self._access = None  # expired access token: exchange the key again
                    continue
                raise self._error(err, method, path, what) from None

    def _error(self, err: urllib.error.HTTPError, method: str, path: str,
               what: str) -> LabelStudioError:
        detail = _detail(err)
        doing = what or f"{method} {path}"
        if err.code == 401:
            kind = "personal access token" if self._personal else "legacy token"
            hint = "" if self._personal else (
                " (Label Studio 1.23 disables legacy tokens unless the organisation enables "
                "them: use a personal access token from Account & Settings)")
            return LabelStudioError(f"Label Studio at {self.url} refused the {kind} in "
                                    f"{KEY_VAR} (HTTP 401: {detail}){hint}")
        if err.code == 403:
            return LabelStudioError(f"Label Studio at {self.url}: the account of {KEY_VAR} "
                                    f"may not {doing} (HTTP 403: {detail})")
        if err.code == 404:
            return NotFound(f"Label Studio at {self.url}: {doing}: not found (HTTP 404)")
        return LabelStudioError(f"Label Studio at {self.url}: {doing} failed (HTTP "
                                f"{err.code}: {detail})")

    # --- what the pipeline asks -----------------------------------------------------------
    def whoami(self) -> dict:
        """The key's account (needs a valid key, creates nothing)."""
        return self.call("GET", "/api/current-user/whoami", what="read the current user")

    def users(self) -> dict[int, str]:
        """Account id -> email, the labeller's recorded identity."""
        out = self.call("GET", "/api/users/", what="list the organisation's users")
        rows = out.get("results", out) if isinstance(out, dict) else out
        return {int(u["id"]): u.get("email") or u.get("username") or str(u["id"]) for u in rows}

    def get(self, path: str, what: str = "", **query: Any) -> Any:
        q = f"?{urllib.parse.urlencode(query)}" if query else ""
        return self.call("GET", f"{path}{q}", what=what)


def check_label_studio(configured_url: str | None = None) -> str:
    """Preflight: the server answers (within 5 s) and takes the key -> the account's email."""
    ls = LabelStudio.from_env(configured_url, timeout_s=5.0)
    me = ls.whoami()
    return str(me.get("email") or me.get("username") or me.get("id"))
