"""Named crash points for testing resume: ``RLHF_CRASH_AT=sft:step:3`` kills the process with
SIGKILL when the run reaches that point (comma-separate several names).

Points: ``<stage>:step:<n>`` after optimizer step n of sft/reward_model, ``ppo:rollout:<n>``
between the rollout and the update of PPO iteration n, ``ppo:check:<n>`` once the held-out
check after iteration n has answered (its metrics not yet logged), ``checkpoint:<stage>:<n>``
inside a checkpoint save (files written, not yet renamed into place), ``after:<stage>`` once a
stage has finished and recorded its output, ``register:policy_version`` once the policy's
version exists (the reward model's not yet), ``register:challenger`` once both versions are
tagged and hold ``challenger``, ``remove:<label>`` once a folder or file being deleted was
renamed to its trash name, not yet deleted (``remove:retention``, ``remove:gc:run_folder``,
``remove:gc:batch``...). Unset (the default), this is a no-op.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "RLHF_CRASH_AT"


def _listed(var: str, name: str) -> bool:
    """Is ``name`` among the comma-separated names in $``var``?"""
    return name in {w.strip() for w in os.environ.get(var, "").split(",")}


def crash_point(name: str) -> None:
    """SIGKILL this process if ``name`` is listed in $RLHF_CRASH_AT."""
    if _listed(ENV_VAR, name):
        os.kill(os.getpid(), signal.SIGKILL)


PAUSE_VAR, PAUSE_FILE_VAR = "RLHF_PAUSE_AT", "RLHF_PAUSE_FILE"


def pause_point(name: str, timeout_s: float = 600.0) -> None:
    """For tests that stop a server at a known point: when ``name`` is listed in
    $RLHF_PAUSE_AT, write ``name`` to the file $RLHF_PAUSE_FILE and wait (up to
    ``timeout_s``) until that file is removed. Points: ``before:<stage>`` (before a stage
    looks up or opens its run), ``evaluate:scored`` (evaluate's figures computed, not yet
    logged), ``register:log_models`` (before the models are logged and registered),
    ``gc:delete`` (`rlhf gc --yes` holds its store's gc lock, has planned, deletes nothing
    yet)."""
    import time
    from pathlib import Path

    if not _listed(PAUSE_VAR, name):
        return
    path = Path(os.environ[PAUSE_FILE_VAR])
    path.write_text(name)
    deadline = time.monotonic() + timeout_s
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
