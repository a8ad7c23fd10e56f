"""`rlhf serve` and `rlhf stage-worker` outlive a Prefect server restart.

Prefect's Runner (what ``prefect.serve`` starts) polls the API for scheduled runs through a
client that retries a refused connection 5 times (2 + 4 + 8 + 16 + 32 s, jittered), and its
poll loop gives up after 3 such failed polls in a row. So an outage of up to about 4 minutes
is ridden out by the Runner itself (a run created after the server is back is picked up when
the poll's current retry wait ends); a longer one ends ``prefect.serve`` with "Service exceeded
error threshold", after the Runner has tried to pause its deployments; without this module
the command would then exit with status 1.

:func:`serve_until_stopped` serves again when that happens: it prints one line, asks the API's
``/health`` every ``RLHF_RECONNECT_EVERY_S`` seconds (default 5) and, once it answers, builds
the deployments anew and serves them (registering them again keeps their ids and unpauses
them). A failed request while the API answers (a 5xx, or a Runner that gave up just as the
server came back) serves again after the same wait, doubled for each such failure in a row
up to ``MAX_FACTOR`` times: a server that answers /health but fails requests (a server on
SQLite answers 503 when two writes collide) is not asked to register every deployment again
each second, and one that recovers is not left waiting long. Serving that lasted ``STEADY_S``
starts the count anew. Any other error ends the command as before. A stop signal ends it at
any point, the server there or not.

Not handled: the Runner's cancellation observer (a websocket, then polling) gives up early in
an outage; if the Runner itself rides the outage out, cancelling a flow run from the UI
no longer stops its process until ``rlhf serve`` is restarted.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator

from tasks.platform.prefect.preflight import no_answer

EVERY_ENV = "RLHF_RECONNECT_EVERY_S"
MAX_FACTOR = 4  # the longest wait after failed requests in a row: this many times every_s()
STEADY_S = 60.0  # serving this long before failing is not "in a row"


def every_s() -> float:
    return float(os.environ.get(EVERY_ENV) or 5)


def failed_wait_s(in_a_row: int) -> float:
    """The wait before serving again after the ``in_a_row``-th failed request in a row
    (1, 2, ...): ``every_s()``, doubled each time, at most ``MAX_FACTOR`` times it."""
    return every_s() * min(2 ** (in_a_row - 1), MAX_FACTOR)


def _say(text: str) -> None:
    print(f"rlhf: {text}", file=sys.stderr, flush=True)


def api_problem(url: str) -> str | None:
    """Why the Prefect API at ``url`` does not answer on /health (one try, 5 s), else None."""
    return no_answer(f"{url.rstrip('/')}/health", 5)


def _causes(err: BaseException) -> Iterator[BaseException]:
    """``err``, the errors grouped in it and their causes."""
    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        todo += list(getattr(e, "exceptions", ()))


def lost_api(err: BaseException) -> bool:
    """Whether ``err`` is how serving ends when the API stops answering: a refused or timed
    out request, a 5xx, or a Prefect poll loop that gave up after failing in a row."""
    import httpx

    for e in _causes(err):
        if isinstance(e, (httpx.TransportError, ConnectionError, TimeoutError)):
            return True
        if isinstance(e, httpx.HTTPStatusError) and e.response.status_code >= 500:
            return True
        if isinstance(e, RuntimeError) and "exceeded error threshold" in str(e):
            return True
    return False


def _first_line(err: BaseException) -> str:
    """``err`` in one line (the first error of a group, not what it was raised while
    handling)."""
    while getattr(err, "exceptions", None):
        err = err.exceptions[0]
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}"[:200]


def serve_until_stopped(deployments: Callable[[], list], what: str) -> None:
    """``prefect.serve(*deployments())`` until a stop signal; when serving ends because the
    API stopped answering, wait for it and serve again. Any other error is raised."""
    from prefect import serve as prefect_serve
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    first, in_a_row = True, 0
    while True:
        # the Runner installs its own SIGTERM handler and leaves it there: put ours back so
        # a SIGTERM while we wait for the server still ends the command
        handler = signal.getsignal(signal.SIGTERM)
        started = time.monotonic()
        try:
            prefect_serve(*deployments(), print_starting_message=first)
            return  # a stop signal: prefect.serve returns (or SystemExit passes through)
        except Exception as err:  # noqa: BLE001 - stop signals are BaseExceptions and pass
            problem = api_problem(url)
            if problem is None and not lost_api(err):
                raise
            why = _first_line(err)
        finally:
            signal.signal(signal.SIGTERM, handler)
            first = False
        if problem is None:  # back already (while the runner gave up), or just back
            in_a_row = 1 if time.monotonic() - started >= STEADY_S else in_a_row + 1
            wait = failed_wait_s(in_a_row)
            _say(f"Prefect API at {url} failed a request ({why}); serving {what} again in "
                 f"{wait:g} s")
            time.sleep(wait)
            continue
        in_a_row = 0
        lost = time.monotonic()
        _say(f"Prefect API at {url} not answering ({problem}); retrying every "
             f"{every_s():g} s")
        while api_problem(url) is not None:
            time.sleep(every_s())
        _say(f"Prefect API at {url} answers again (waited {time.monotonic() - lost:.0f} s); "
             f"serving {what} again")
