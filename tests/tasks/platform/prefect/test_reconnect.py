"""serve_until_stopped's waits: a server that answers /health but keeps failing requests is
asked again after longer and longer waits, and serving that lasted starts the count anew.
``prefect.serve`` and the clock are replaced; the rest is the module's own loop."""

from __future__ import annotations

import httpx
import prefect
import pytest

from tasks.platform.prefect import reconnect


def status_error(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "http://127.0.0.1:1/api/deployments/x")
    return httpx.HTTPStatusError(f"{code}", request=request,
                                 response=httpx.Response(code, request=request))


class Clock:
    """time.monotonic and time.sleep on a clock that only sleeping and serving move."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(reconnect.time, "monotonic", c.monotonic)
    monkeypatch.setattr(reconnect.time, "sleep", c.sleep)
    monkeypatch.setattr(reconnect, "api_problem", lambda url: None)  # /health answers
    monkeypatch.setenv(reconnect.EVERY_ENV, "1")
    return c


def serving(monkeypatch, clock, outcomes):
    """prefect.serve that lasts, then raises, each (seconds, error) of ``outcomes`` in turn,
    and returns (a stop signal) after the last."""
    todo = list(outcomes)

    def fake_serve(*deployments, print_starting_message=True):
        if not todo:
            return
        lasted, err = todo.pop(0)
        clock.now += lasted
        raise err

    monkeypatch.setattr(prefect, "serve", fake_serve)


def test_failed_requests_in_a_row_wait_twice_as_long_each_time_up_to_the_cap(monkeypatch,
                                                                             clock):
    serving(monkeypatch, clock, [(0.5, status_error(503))] * 5)
    reconnect.serve_until_stopped(lambda: [], "d/test")
    assert clock.sleeps == [1, 2, 4, 4, 4]


def test_serving_that_lasted_starts_the_count_anew(monkeypatch, clock):
    steady = reconnect.STEADY_S
    serving(monkeypatch, clock, [(0.5, status_error(503)), (0.5, status_error(503)),
                                 (steady, status_error(502)), (0.5, status_error(503))])
    reconnect.serve_until_stopped(lambda: [], "d/test")
    assert clock.sleeps == [1, 2, 1, 2]


def test_an_error_that_is_not_the_api_ends_serving(monkeypatch, clock):
    serving(monkeypatch, clock, [(0.5, status_error(404))])
    with pytest.raises(httpx.HTTPStatusError):
        reconnect.serve_until_stopped(lambda: [], "d/test")
    assert clock.sleeps == []


def test_the_waits_follow_the_setting(monkeypatch):
    monkeypatch.setenv(reconnect.EVERY_ENV, "5")
    assert [reconnect.failed_wait_s(k) for k in range(1, 6)] == [5, 10, 20, 20, 20]
