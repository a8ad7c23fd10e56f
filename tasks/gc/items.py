"""What `rlhf gc` found: one record per thing it looked at, and the plan."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Kind = Literal["run folder", "trash", "leftover", "mlflow run", "batch", "pull record", "cache"]
DAY_S = 86400.0


class Found(BaseModel):
    """One thing gc looked at: a path or a run id, whether it goes, and why (or why not)."""

    model_config = ConfigDict(frozen=True)
    kind: Kind
    target: str
    delete: bool
    reason: str
    bytes: int = 0
    pairs: int = 0  # a pull record: its collection's pairs, all pulled
    runs: list[str] = []  # a deleted pipeline run: its stage runs, purged with it

    def line(self) -> str:
        size = "" if not self.bytes else f" ({self.bytes / 1e6:.1f} MB)" \
            if self.bytes >= 100_000 else f" ({self.bytes / 1e3:.1f} kB)"
        return f"{self.kind} {self.target}{size}: {self.reason}"


class GcPlan(BaseModel):
    """Everything gc found, in the order it deletes; ``notes`` say what it could not do."""

    model_config = ConfigDict(frozen=True)
    tracking_uri: str
    found: list[Found]
    notes: list[str] = []

    @property
    def deletions(self) -> list[Found]:
        return [f for f in self.found if f.delete]

    @property
    def kept(self) -> list[Found]:
        return [f for f in self.found if not f.delete]


def is_hex(name: str, length: int) -> bool:
    """A run id (32 hex digits) or a validation cache key (64)."""
    return len(name) == length and all(c in "0123456789abcdef" for c in name)
