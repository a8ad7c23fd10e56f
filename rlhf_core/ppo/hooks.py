"""What the RL loop calls out to: the caller's callbacks and a watch, implemented a layer above
(rlhf_core/health/watch.py); the loop knows only this protocol."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

# on_iteration(iteration, metrics, sample rows | None)
IterationFn = Callable[[int, dict[str, float], list[dict] | None], None]
# monitor(prompts, responses, has_eos) -> metrics on the decoded rollouts
MonitorFn = Callable[[list[str], list[str], list[bool]], dict[str, float]]
VerdictFn = Callable[[Any], None]  # on_verdict(the watch's verdict of an iteration)


class Watcher(Protocol):
    """What the loop asks of a watch: ``observe`` each iteration -> a verdict whose ``stop``
    ends PPO; ``restore_healthy`` puts the last healthy snapshot back."""

    def observe(self, trainer: Any, iteration: int, metrics: dict[str, float]) -> Any: ...

    def first_stop(self) -> Any: ...

    def restore_healthy(self, trainer: Any, finding: Any) -> int | None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...
