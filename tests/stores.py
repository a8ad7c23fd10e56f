"""New SQLite MLflow stores from a template: MLflow makes a new store's tables by running its
whole migration history (about a second of CPU each time, in a process that has run it
before, more in a fresh one). The test process makes one such store per session (conftest.py),
then starts each new SQLite store of its own as a copy of it; a test may also seed the store
of a server or CLI process it starts (:func:`seed_sqlite_store`)."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

_LOCK = threading.Lock()
_STATE: dict = {}  # folder, original: while sqlite_stores_from_a_template is open


def _template() -> Path:
    """The template store (made by MLflow's own set-up on first use)."""
    import sqlalchemy

    folder = _STATE["folder"]
    template = folder / "template.db"
    with _LOCK:
        if not template.exists():
            built = sqlalchemy.create_engine(f"sqlite:///{folder / 'building.db'}")
            try:
                _STATE["original"](built)
            finally:
                built.dispose()
            (folder / "building.db").rename(template)
    return template


def _initialize_tables(engine) -> None:
    if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        _STATE["original"](engine)
        return
    raw = engine.raw_connection()
    try:
        with closing(sqlite3.connect(_template())) as source:
            source.backup(raw.driver_connection)
    finally:
        raw.close()


@contextmanager
def sqlite_stores_from_a_template() -> Iterator[None]:
    """While open, MLflow's table set-up of a new SQLite file store in this process copies the
    template. Other databases, and in-memory SQLite, get MLflow's own set-up."""
    import mlflow.store.db.utils as db_utils
    import mlflow.store.model_registry.sqlalchemy_store as registry_store

    # the registry store imported the function by name
    targets = [(db_utils, "_initialize_tables"), (registry_store, "_initialize_tables")]
    _STATE.update(folder=Path(tempfile.mkdtemp(prefix="rlhf-test-mlflow-store-")),
                  original=db_utils._initialize_tables)
    for module, name in targets:
        setattr(module, name, _initialize_tables)
    try:
        yield
    finally:
        for module, name in targets:
            setattr(module, name, _STATE["original"])
        shutil.rmtree(_STATE.pop("folder"), ignore_errors=True)


def seed_sqlite_store(uri: str) -> None:
    """A ``sqlite:///`` store that does not exist yet starts as a copy of the template (when
    the session has one open); any other URI, or an existing file, is left alone."""
    path = Path(uri.removeprefix("sqlite:///"))
    if "folder" in _STATE and uri.startswith("sqlite:///") and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_template(), path)
