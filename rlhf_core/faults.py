"""Named crash points for testing resume: ``RLHF_CRASH_AT=sft:step:3`` kills the process with
SIGKILL when the run reaches that point (comma-separate several names).

Points: ``<stage>:step:<n>`` after optimizer step n of sft/reward_model, ``ppo:rollout:<n>``
between the rollout and the update of PPO iteration n, ``checkpoint:<stage>:<n>`` inside a
checkpoint save (files written, not yet renamed into place), ``after:<stage>`` once a stage
has finished and recorded its output, ``register:policy_version`` once the policy's version
exists (the reward model's not yet), ``register:challenger`` once both versions are tagged and
hold ``challenger``. Unset (the default), this is a no-op.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "RLHF_CRASH_AT"


def crash_point(name: str) -> None:
    """SIGKILL this process if ``name`` is listed in $RLHF_CRASH_AT."""
    wanted = os.environ.get(ENV_VAR)
    if wanted and name in {w.strip() for w in wanted.split(",")}:
        os.kill(os.getpid(), signal.SIGKILL)
