"""What Prefect draws as a task's upstream edges: its direct data dependencies only. Prefect
draws an edge from every task whose result a task is given, and stages are given more than they
directly use (prepare's result, records another input derives from), so each record remembers
what it was made from and inputs implied by another are passed in ``quote`` (no edge)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prefect.utilities.annotations import quote
from pydantic import BaseModel

from tasks.pipeline.prepare import Prepared
from tasks.pipeline.stages.records import StageRecord

EDGE_KINDS = (StageRecord, Prepared)  # what tasks hand each other; the rest is run-wide

# id(record) -> (the record, kept alive so its id is not reused; ids it derives from)
_MADE_FROM: dict[int, tuple[BaseModel, frozenset[int]]] = {}


def _records(values: Iterable[Any]) -> list[BaseModel]:
    return [v for v in values if isinstance(v, EDGE_KINDS)]


def derived_from(value: Any) -> frozenset[int]:
    """Ids of every record ``value`` was made from (none for a record no task made)."""
    entry = _MADE_FROM.get(id(value))
    return entry[1] if entry is not None else frozenset()


def note_made_from(record: Any, inputs: Iterable[Any]) -> None:
    """Remember that ``record`` (a task's result) was made from the records in ``inputs``."""
    if not isinstance(record, BaseModel):
        return
    ids: set[int] = set()
    for value in _records(inputs):
        ids.add(id(value))
        ids.update(derived_from(value))
    _MADE_FROM[id(record)] = (record, frozenset(ids))


def latest(values: Iterable[Any]) -> list[BaseModel]:
    """The records among ``values`` that no other of them derives from."""
    records = _records(values)
    implied = set().union(*(derived_from(r) for r in records)) if records else set()
    return [r for r in records if id(r) not in implied]


def direct_edges(arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` with all but its latest records wrapped in ``quote`` (no edge), the run
    context too: it is part of prepare's result."""
    keep = {id(r) for r in latest(arguments.values())}
    return {name: value if id(value) in keep or value is None else quote(value)
            for name, value in arguments.items()}
