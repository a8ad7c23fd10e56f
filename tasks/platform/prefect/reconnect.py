"""`rlhf serve` and `rlhf stage-worker` outlive a Prefect server restart: where Prefect's Runner
gives up, :func:`serve_until_stopped` waits for the API and serves again. Not handled: after an
outage, cancelling a flow run from the UI may not stop its process until a restart."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

from tasks.platform.prefect.preflight import no_answer

EVERY_ENV = "RLHF_RECONNECT_EVERY_S"
STEADY_S = 60.0  # serving this long before failing is not "in a row"


def every_s() -> float:
    return float(os.environ.get(EVERY_ENV) or 5)


def failed_wait_s(in_a_row: int) -> float:
    """``every_s()`` doubled per failed request in a row, at most 4 times it."""
    return every_s() * min(2 ** (in_a_row - 1), 4)


def _say(text: str) -> None:
    print(f"rlhf: {text}", file=sys.stderr, flush=True)


def api_problem(url: str) -> str | None:
    """Why the Prefect API at ``url`` does not answer on /health (one try, 5 s), else None."""
    return no_answer(f"{url.rstrip('/')}/health", 5)


def lost_api(err: BaseException) -> bool:
    """Whether ``err`` (an error grouped in it, or a cause) is how serving ends on a lost API."""
    import httpx

    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, (httpx.TransportError, ConnectionError, TimeoutError)):
            return True
        if isinstance(e, httpx.HTTPStatusError) and e.response.status_code >= 500:
            return True
        if isinstance(e, RuntimeError) and "exceeded error threshold" in str(e):
            return True
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        todo += list(getattr(e, "exceptions", ()))
    return False


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
            while getattr(err, "exceptions", None):  # a group: its first error, in one line
                err = err.exceptions[0]
            why = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"[:200]
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
