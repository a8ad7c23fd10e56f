"""The retrain loop's typed records, shared by the flows, the CLI and the tests."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from tasks.pipeline.results import PipelineResult
from tasks.pipeline.rule import Decision
from tasks.pipeline.stages.records import StageRecord


class Batch(BaseModel):
    """One preference batch by digest; ``path`` None: its file left the watch folder;
    ``run_id``: the retrain run that consumed it and keeps a copy."""

    model_config = ConfigDict(frozen=True)
    name: str
    digest: str
    path: str | None = None
    run_id: str | None = None


class Round(BaseModel):
    """What a round trains on; a ``challenge`` starts from the champion and is gated against
    it (else a bootstrap); a ``control`` round registers and consumes nothing."""

    model_config = ConfigDict(frozen=True)
    batches: list[Batch]
    consumed: list[Batch] | None = None
    challenge: bool = False
    control: bool = False


class Batches(BaseModel):
    """The watch folder's batches: new ones and those earlier retrains consumed."""

    model_config = ConfigDict(frozen=True)
    new: list[Batch] = []
    consumed: list[Batch] = []


class CollectResult(BaseModel):
    """One collection (``label_studio``: the project page it filled; None: files only)."""

    model_config = ConfigDict(frozen=True)
    collection: str
    run_id: str
    policy: str
    paths: dict[str, str]
    counts: dict[str, int]
    label_studio: str | None = None
    wall_s: float = 0.0

    def text(self) -> str:
        """What the collection did, for the CLI and flow log."""
        n = self.counts
        where = (f"to label: Label Studio {self.label_studio}, then `rlhf label pull "
                 f"{self.collection}`" if self.label_studio else
                 f"to label: {self.paths['jsonl']} (or {self.paths['csv']})")
        long = n.get("prompts_over_budget", 0)
        skipped = f", {long} skipped as over validation.max_prompt_tokens" if long else ""
        return (f"collection {self.collection} from {self.policy}: {n['prompts']} fresh "
                f"prompts{skipped} ({n['pool_used']} of the pool's {n['pool']} now used), "
                f"{n['candidates']} candidate pairs; dropped {n['empty']} with an empty side, "
                f"{n.get('over_budget', 0)} with a side over validation.max_response_tokens, "
                f"{n['identical']} identical, {n['repeated']} repeated; {n['kept']} kept; "
                f"{n['rows']} rows to label, {n['known']} of them known-answer pairs\n"
                f"{where}; MLflow run {self.run_id}")


class LabelImport(BaseModel):
    """What importing one labelled file did; ``held_back``: labellers whose votes were
    dropped, and why."""

    model_config = ConfigDict(frozen=True)
    status: Literal["imported", "quarantined", "already imported", "refused"]
    file: str
    batch: str | None = None
    digest: str | None = None
    reason: str | None = None
    text: str = ""
    run_id: str | None = None
    moved_to: str | None = None
    where: str | None = None
    counts: dict[str, int] = {}
    held_back: dict[str, str] = {}

    def summary(self) -> str:
        if self.status == "imported":
            return f"imported {self.file}: {self.text}\npreference batch: {self.batch}"
        if self.status == "quarantined":
            return (f"QUARANTINED {self.file}: {self.reason}\n{self.text}\n{self.where}; "
                    "nothing will train on it")
        return f"{self.file}: {self.status} ({self.batch})"


class GateRecord(StageRecord):
    """gate: the decision (and its figures in ``metrics``)."""

    decision: Decision


class RetrainResult(BaseModel):
    """What a retrain round did; fields unset where its status has none."""

    model_config = ConfigDict(frozen=True)
    status: Literal["bootstrapped", "promoted", "kept", "control", "skipped", "nothing new",
                    "awaiting approval", "approved", "rejected", "timed out"]
    decision: Decision | None = None
    run: PipelineResult | None = None
    slot: str | None = None
    held_by: str | None = None
    consumed: int = 0
    candidate: int | None = None  # the version waiting for (or given) a person's answer
    answer: str | None = None  # what the answer came to (an answered round)


class CompareResult(BaseModel):
    """Two registered versions through the gate (``champion`` the base)."""

    model_config = ConfigDict(frozen=True)
    champion: int
    challenger: int
    decision: Decision
    run: PipelineResult
