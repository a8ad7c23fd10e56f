"""What a flow asks of the Prefect API itself, and a one-slot concurrency limit (one retrain
at a time) whose holder can be named."""

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from typing import Any


def api_client():
    """Prefect's synchronous API client (Prefect is imported when first needed)."""
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def in_prefect_run() -> bool:
    """Inside a Prefect flow or task run (where artifacts and events have a run to go to)."""
    from prefect.context import get_run_context

    try:
        get_run_context()
        return True
    except Exception:  # noqa: BLE001 - prefect raises different errors outside a run
        return False


def report(key: str, markdown: str, description: str) -> None:
    """A Prefect markdown artifact when inside a run; its heading and ``Next:`` lines printed."""
    lines = markdown.strip().splitlines()
    nxt = next((i for i, line in enumerate(lines) if line.startswith("Next:")), len(lines))
    print("\n".join([lines[0].lstrip("# "), *lines[nxt:]]))
    if in_prefect_run():
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(key=key, markdown=markdown, description=description)


def deployment_parameters() -> dict[str, Any]:
    """The served config stored on this run's deployment ({} outside a deployment run)."""
    from prefect.runtime import deployment

    if deployment.id is None:
        return {}
    with api_client() as client:
        return dict(client.read_deployment(deployment.id).parameters or {})


def flow_run_name() -> str | None:
    """The current flow run's name (None outside a flow run)."""
    from prefect.runtime import flow_run

    return flow_run.name if flow_run.id is not None else None


def rename_flow_run(name: str) -> None:
    """Rename the current flow run, in the API and its context (no-op outside a run)."""
    from prefect.context import FlowRunContext
    from prefect.runtime import flow_run

    if flow_run.id is None:
        return
    with api_client() as client:
        client.update_flow_run(flow_run.id, name=name[:100])
    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None:
        ctx.flow_run.name = name[:100]


def ensure_limit(name: str) -> None:
    """Create the one-slot global concurrency limit if the server has none by that name."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with api_client() as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with suppress(ObjectAlreadyExists):  # another process created it meanwhile
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=1))


SLOW_ANSWER_S = 120.0  # how long a skipping caller keeps asking for a slot that reads free
LEASE_S = 300.0  # a held slot's lease, renewed while its holder lives (Prefect's default)
SLOT_TAG = "rlhf.slot:"  # + limit name: a Prefect flow-run tag, not an MLflow tag


def slot_holder(name: str) -> str:
    """Who holds the slot ``name``: the running flow run(s) tagged as its holder, else a
    sentence saying none can be named."""
    from prefect.client.schemas import filters
    from prefect.client.schemas.objects import StateType
    from prefect.runtime import flow_run

    running = filters.FlowRunFilterStateType(any_=[StateType.RUNNING])
    with api_client() as client:
        runs = client.read_flow_runs(flow_run_filter=filters.FlowRunFilter(
            tags=filters.FlowRunFilterTags(all_=[SLOT_TAG + name]),
            state=filters.FlowRunFilterState(type=running)))
    runs = [r for r in runs if str(r.id) != str(flow_run.id)]
    if not runs:
        return ("a holder Prefect cannot name (not a running flow run: the slot frees itself "
                f"within {LEASE_S / 60:g} minutes of its holder's end)")
    return ", ".join(f"flow run '{r.name}' ({r.id})" for r in runs)


@contextmanager
def one_slot(name: str, skip: bool) -> Iterator[bool]:
    """Hold the one-slot limit ``name`` for the body -> True; with ``skip``, False when
    another run holds it (else block until free). The current flow run is tagged as holder."""
    from prefect.concurrency.sync import concurrency
    from prefect.runtime import flow_run

    ensure_limit(name)
    deadline = time.monotonic() + SLOW_ANSWER_S
    while True:
        if skip:
            with api_client() as client:
                limit = client.read_global_concurrency_limit_by_name(name)
            if limit.active_slots >= limit.limit:
                yield False
                return
        with ExitStack() as stack:
            try:  # skip: the slot read free a moment ago; the timeout bounds a lost race
                stack.enter_context(concurrency(name, occupy=1, strict=True, lease_duration=LEASE_S,
                                                timeout_seconds=15.0 if skip else None))
            except TimeoutError:  # a holder came first, or a loaded server answered late:
                if time.monotonic() < deadline:  # the slot is read again, and asked again
                    continue
                yield False
                return
            if flow_run.id is not None:
                with api_client() as client:
                    tags = list(client.read_flow_run(flow_run.id).tags or [])
                    client.update_flow_run(flow_run.id, tags=[*tags, SLOT_TAG + name])
            yield True
            return
