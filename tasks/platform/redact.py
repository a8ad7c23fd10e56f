"""Secrets never recorded: a URL's password is hidden wherever a config value or URI is logged
or shown (``http://bob:***@host``)."""

from __future__ import annotations

import re
from typing import Any

URL_LOGIN = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*):[^@/\s]+@")


def redact(text: str) -> str:
    """``scheme://user:password@host`` -> ``scheme://user:***@host`` (anywhere in text)."""
    return URL_LOGIN.sub(r"\g<head>:***@", text)


def redacted(value: Any) -> Any:
    """``value`` (nested dicts, lists, strings) with every URL's password hidden."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redacted(v) for v in value)
    return value
