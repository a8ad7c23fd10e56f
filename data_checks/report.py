"""The data gate's report (data_checks/validate.py): verdict, failures, warnings, figures,
GX's merged results, and what a reuse restores."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ValidationReport:
    passed: bool = True
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)
    results_json: dict = field(default_factory=dict)
    chat: dict = field(default_factory=dict)  # conversational data: what prepare_chat did
    gx_context: object = field(default=None, repr=False)  # holds the results for Data Docs
    gx_docs: Path | None = None  # a reused validation's Data Docs (data_checks/cache.py)
    reused: str = ""  # the key of the passed validation this one reused ("" if it ran)
    # chunks of data tokenized, and read as an earlier gate tokenized them (ChunkTokens)
    chunks_tokenized: int = 0
    chunks_kept: int = 0
    # data set -> the first rows the budget dropped, {"row": n, columns...}, up to
    # validate.py's DROPPED_SHOWN
    dropped: dict[str, list[dict]] = field(default_factory=dict)
    to_keep: tuple | None = field(default=None, repr=False)  # (cache, key, paths, out_dir)

    def fields(self) -> dict:
        """What a reuse restores (data_checks/cache.py)."""
        return {"warnings": self.warnings, "stats": self.stats,
                "results_json": self.results_json, "chat": self.chat, "dropped": self.dropped}

    def chunks_line(self) -> str:
        def n(count: int) -> str:
            return f"{count} chunk{'' if count == 1 else 's'}"
        return (f"tokenized {n(self.chunks_tokenized)} of data; {n(self.chunks_kept)} came "
                "tokenized from an earlier gate (data_checks/cache.py)")

    def expectation_counts(self) -> dict[str, tuple[int, int]]:
        """data set -> (expectations passed, expectations evaluated)."""
        return {name: (res["statistics"]["successful_expectations"],
                       res["statistics"]["evaluated_expectations"])
                for name, res in self.results_json.items()}

    def summary_markdown(self) -> str:
        lines = [f"# Data validation: {'PASSED' if self.passed else 'FAILED'}", ""]
        if self.reused:
            lines += [f"Reused: the same data files, checks and tokenizer passed before "
                      f"(validation key {self.reused[:16]}); the suites did not run again.", ""]
        if self.chunks_kept:
            lines += [self.chunks_line().capitalize() + ".", ""]
        lines += [f"- FAILED: {f}" for f in self.failures]
        lines += [f"- warning: {w}" for w in self.warnings]
        lines += ["", "| data | expectations passed | rows kept |", "|---|---|---|"]
        lines += [f"| {name} | {ok}/{n} | {self.stats.get(f'{name}/n_rows', 0):g} |"
                  for name, (ok, n) in self.expectation_counts().items()]
        lines += ["", "| figure | value |", "|---|---|"]
        lines += [f"| {k} | {v:g} |" for k, v in sorted(self.stats.items())]
        return "\n".join(lines)
