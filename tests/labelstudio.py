"""A real Label Studio server for tests, from its own virtual environment (its pinned
requirements conflict with the project's): `make label-studio` makes it at
``.venv-label-studio`` (or set LABEL_STUDIO_VENV). Started on a free port of 127.0.0.1 with
its own data folder (SQLite), ended by its PID. Accounts and their personal access tokens are
made through Label Studio's Django management shell, as an administrator would without the
UI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers import _http_ok, free_port, stop, wait_until

ROOT = Path(__file__).resolve().parent.parent
ADMIN, ADMIN_PASSWORD, LEGACY = "admin@rlhf.test", "admin-pass-1234", "legacy-token-for-tests"


def venv() -> Path:
    return Path(os.environ.get("LABEL_STUDIO_VENV") or ROOT / ".venv-label-studio")


def require_label_studio() -> Path:
    """The Label Studio venv, or skip saying how to make it."""
    exe = venv() / "bin" / "label-studio"
    if not exe.exists():
        pytest.skip(f"no Label Studio at {venv()}: `make label-studio` installs it in its "
                    "own venv (or set LABEL_STUDIO_VENV)")
    return venv()


@dataclass
class LabelStudioServer:
    url: str
    data_dir: Path
    venv: Path
    admin_key: str  # the admin's personal access token (JWT)
    legacy_key: str  # the admin's legacy token (legacy tokens enabled on this server)

    def manage(self, code: str) -> str:
        """Run Python in Label Studio's Django shell -> what it printed."""
        site = next((self.venv / "lib").glob("python3*/site-packages"))
        env = {**os.environ, "LABEL_STUDIO_BASE_DATA_DIR": str(self.data_dir),
               "DJANGO_SETTINGS_MODULE": "core.settings.label_studio"}
        env.pop("PYTHONPATH", None)
        out = subprocess.run([str(self.venv / "bin" / "python"),
                              str(site / "label_studio" / "manage.py"), "shell", "-c", code],
                             env=env, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"Label Studio shell failed:\n{out.stderr[-3000:]}")
        return out.stdout

    def accounts(self, emails: list[str]) -> dict[str, str]:
        """Labeller accounts in the admin's organisation -> {email: personal access token}
        (the admin's token, made in the same call, is kept as ``admin_key``)."""
        code = f"""
import json
from users.models import User
from organizations.models import Organization
from jwt_auth.models import LSAPIToken
org = Organization.objects.first()
out = {{}}
for email in {[ADMIN, *emails]!r}:
    user = User.objects.filter(email=email).first() or User.objects.create_user(
        email=email, password="labeller-pass-1234", username=email.split("@")[0])
    org.add_user(user)
    user.active_organization = org
    user.save()
    out[email] = LSAPIToken.for_user(user).get_full_jwt()
print("ACCOUNTS" + json.dumps(out))
"""
        line = next(x for x in self.manage(code).splitlines() if x.startswith("ACCOUNTS"))
        keys = json.loads(line.removeprefix("ACCOUNTS"))
        self.admin_key = keys.pop(ADMIN)
        return keys


@contextmanager
def label_studio_server(folder: Path) -> Iterator[LabelStudioServer]:
    """`label-studio start` on a free port of 127.0.0.1 (SQLite in ``folder``) with an admin
    account, legacy tokens enabled (so both kinds of key can be tested) -> the server."""
    lsv = require_label_studio()
    port, data = free_port(), folder / "label-studio"
    template = lsv / "template"  # migrated once by `make label-studio`: starts in seconds
    if (template / "label_studio.sqlite3").exists() and not data.exists():
        shutil.copytree(template, data)
    data.mkdir(parents=True, exist_ok=True)
    log = folder / "label-studio.log"
    env = {**os.environ, "LABEL_STUDIO_BASE_DATA_DIR": str(data),
           "LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK": "true", "SENTRY_DSN": "",
           "LATEST_VERSION_CHECK": "false", "COLLECT_ANALYTICS": "false"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.Popen(
        [str(lsv / "bin" / "label-studio"), "start", "--port", str(port),
         "--internal-host", "127.0.0.1", "--no-browser", "--data-dir", str(data),
         "--username", ADMIN, "--password", ADMIN_PASSWORD,
         "--enable-legacy-api-token", "--user-token", LEGACY],
        stdout=open(log, "a"), stderr=subprocess.STDOUT, env=env, cwd=folder)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _http_ok(f"{url}/health"), proc, log, "label studio", 240)
        yield LabelStudioServer(url, data, lsv, "", LEGACY)
    finally:
        stop(proc)
