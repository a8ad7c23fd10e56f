"""What a flow asks of the Prefect API itself: the parameters of the deployment it runs
from, and a one-slot global concurrency limit (one retrain at a time)."""

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any


def deployment_parameters() -> dict[str, Any]:
    """The served config stored on this run's deployment ({} outside a deployment run)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import deployment

    if deployment.id is None:
        return {}
    with get_client(sync_client=True) as client:
        return dict(client.read_deployment(deployment.id).parameters or {})


def ensure_limit(name: str) -> None:
    """Create the one-slot global concurrency limit if the server has none by that name."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:
                pass


def _slot_taken(name: str) -> bool:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(name)
    return limit.active_slots >= limit.limit


@contextmanager
def one_slot(name: str, skip: bool) -> Iterator[bool]:
    """Hold the one-slot global concurrency limit ``name`` while the body runs -> True; with
    ``skip``, False when another run holds it (else block until it is free)."""
    from prefect.concurrency.sync import concurrency

    ensure_limit(name)
    if skip and _slot_taken(name):
        yield False
        return
    with ExitStack() as stack:
        try:  # skip: the slot was free a moment ago; the timeout only bounds a lost race (a
            # 1 s bound skipped free-slot runs when a loaded server answered slowly)
            stack.enter_context(concurrency(name, occupy=1, strict=True,
                                            timeout_seconds=15.0 if skip else None))
        except TimeoutError:
            yield False
            return
        yield True


