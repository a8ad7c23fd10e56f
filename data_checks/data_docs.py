"""The gate's pages (data_checks/validate.py): ``results.json``, GX's Data Docs, the rows the
budget dropped and a one-page summary; a passed validation is kept in the cache from here."""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

from data_checks.report import ValidationReport
from data_checks.suites import build_gx_docs


def write_data_docs(report: ValidationReport, out_dir) -> Path:
    """``results.json``, GX's Data Docs under ``gx/`` and a one-page summary ``index.html``
    (every expectation and its outcome, plus the budget failures GX does not see)."""
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
    gx_link = ""
    if report.gx_context is not None:
        build_gx_docs(report.gx_context, out / "gx")
    elif report.gx_docs is not None:  # a reused validation's
        shutil.rmtree(out / "gx", ignore_errors=True)
        shutil.copytree(report.gx_docs, out / "gx")
    if (out / "gx" / "index.html").exists():
        gx_link = "<p><a href='gx/index.html'>great-expectations Data Docs</a></p>"
    if report.passed and report.to_keep is not None:
        from data_checks import cache as kept

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
