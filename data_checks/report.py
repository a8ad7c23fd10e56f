"""The data gate's report (verdict, failures, warnings, figures, GX's merged results) and its
pages: ``results.json``, GX's Data Docs, the rows the budget dropped and a one-page summary.
"""

from __future__ import annotations

import html
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from data_checks import cache as kept


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
    chunks_tokenized: int = 0  # chunks of data tokenized
    chunks_kept: int = 0  # ... and read as an earlier gate tokenized them
    # data set -> the first rows the budget dropped, {"row": n, columns...}
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


def build_gx_docs(context, site_dir: Path) -> None:
    """GX's own Data Docs site of the results ``context`` stores, in ``site_dir``."""
    shutil.rmtree(site_dir, ignore_errors=True)
    site = {"class_name": "SiteBuilder", "show_how_to_buttons": False,
            "store_backend": {"class_name": "TupleFilesystemStoreBackend",
                              "base_directory": str(site_dir.resolve())},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"}}
    if "rlhf" in context.get_site_names():
        context.update_data_docs_site("rlhf", site)
    else:
        context.add_data_docs_site("rlhf", site)
    context.build_data_docs(site_names=["rlhf"])
    for decoration in (site_dir / "static").rglob("*"):  # GX's unused stock GIFs and fonts
        if decoration.suffix in (".gif", ".otf"):
            decoration.unlink()


def write_data_docs(report: ValidationReport, out_dir) -> Path:
    """``results.json``, GX's Data Docs under ``gx/`` and a one-page summary ``index.html``;
    a passed validation is kept in the cache from here."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report.results_json, indent=1, default=str))
    shutil.rmtree(out / "dropped", ignore_errors=True)
    for name, rows in report.dropped.items():
        if rows:  # the rows the budget dropped, numbered as in the file (the first ones)
            (out / "dropped").mkdir(exist_ok=True)
            (out / "dropped" / f"{name}.jsonl").write_text(
                "".join(json.dumps(r, default=str, ensure_ascii=False) + "\n" for r in rows),
                encoding="utf-8")
    if report.gx_context is not None:
        build_gx_docs(report.gx_context, out / "gx")
    elif report.gx_docs is not None:  # a reused validation's
        shutil.rmtree(out / "gx", ignore_errors=True)
        shutil.copytree(report.gx_docs, out / "gx")
    gx_link = "<p><a href='gx/index.html'>great-expectations Data Docs</a></p>" \
        if (out / "gx" / "index.html").exists() else ""
    if report.passed and report.to_keep is not None:
        cache, key, paths, cleaned_dir = report.to_keep
        kept.keep(cache, key, report.fields(), paths, cleaned_dir,
                  out / "gx" if gx_link else None)
    rows = []
    for name, res in report.results_json.items():
        for r in res.get("results", []):
            cfg = r["expectation_config"]
            kwargs = {k: v for k, v in cfg["kwargs"].items() if k != "batch_id"}
            ok = "pass" if r["success"] else "FAIL"
            rows.append(f"<tr class='{ok}'><td>{html.escape(name)}</td><td>{cfg['type']}</td>"
                        f"<td>{html.escape(json.dumps(kwargs))}</td><td>{ok}</td>"
                        f"<td>{r['result'].get('unexpected_count', '')}</td></tr>")
    page = ("<html><head><meta charset='utf-8'><title>Data validation</title><style>"
            "td{padding:2px 8px}.FAIL{background:#fdd}.pass{background:#dfd}</style></head>"
            f"<body><h1>Data validation: {'PASSED' if report.passed else 'FAILED'}</h1>"
            + "".join(f"<p>FAILED: {html.escape(f)}</p>" for f in report.failures)
            + "".join(f"<p>warning: {html.escape(w)}</p>" for w in report.warnings) + gx_link
            + "<table><tr><th>data</th><th>expectation</th><th>arguments</th><th>result</th>"
            "<th>unexpected</th></tr>" + "".join(rows) + "</table></body></html>")
    (out / "index.html").write_text(page)
    return out
