"""The data gate: length budgets, great-expectations suites, a report, cleaned JSONL files.

GX 1.x pitfalls handled here: ``UnexpectedRowsExpectation`` does not run on pandas, and under
pandas 3 text columns have dtype ``str``; so row-level facts (chosen == rejected, token
lengths) are derived columns checked with plain column expectations. Each data set runs as a
GX ``ValidationDefinition`` in an ephemeral context, whose results store then feeds GX's own
Data Docs, built once, when ``write_data_docs`` asks for them.
"""

from __future__ import annotations

import html
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from data_checks.budget import TEXT_FIELDS, apply_length_budget
from data_checks.config import DataConfig, ValidationConfig
from data_checks.conversations import ConversationError, render_conversations
from data_checks.errors import ValidationFailed  # noqa: F401  (re-exported)
from data_checks.loading import COLUMNS, KINDS, DataError, forget_reads, take_read
from data_checks.messages import failure_sentence
from data_checks.text_checks import check_text, duplicate_rows
from data_checks.token_files import tokens_path, write_tokens
from data_checks.tokens import Tokenized, tokenize_frame


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
    to_keep: tuple | None = field(default=None, repr=False)  # (cache, key, paths, out_dir)

    def fields(self) -> dict:
        """What a reuse restores (data_checks/cache.py)."""
        return {"warnings": self.warnings, "stats": self.stats,
                "results_json": self.results_json, "chat": self.chat}

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
        lines += [f"- FAILED: {f}" for f in self.failures]
        lines += [f"- warning: {w}" for w in self.warnings]
        lines += ["", "| data | expectations passed | rows kept |", "|---|---|---|"]
        lines += [f"| {name} | {ok}/{n} | {self.stats.get(f'{name}/n_rows', 0):g} |"
                  for name, (ok, n) in self.expectation_counts().items()]
        lines += ["", "| figure | value |", "|---|---|"]
        lines += [f"| {k} | {v:g} |" for k, v in sorted(self.stats.items())]
        return "\n".join(lines)


def _with_checks(df: pd.DataFrame, kind: str, tokens: Tokenized) -> pd.DataFrame:
    """Derived columns the suites check: token lengths (responses with their EOS), chosen ==
    rejected."""
    checks = {"prompt_tokens": tokens.lengths("prompt"),
              **{f"{col}_tokens": tokens.lengths(col) + 1 for col in TEXT_FIELDS[kind]}}
    if kind == "preference":
        checks["chosen_equals_rejected"] = df["chosen"] == df["rejected"]
    return df.assign(**checks)  # the text is shared with df, not copied


def build_suite(kind: str, cfg: ValidationConfig):
    import great_expectations as gx
    import great_expectations.expectations as gxe

    suite = gx.ExpectationSuite(name=f"rlhf_{kind}")
    for col in COLUMNS[kind]:
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=col))
        suite.add_expectation(gxe.ExpectColumnValueLengthsToBeBetween(column=col, min_value=1))
        suite.add_expectation(gxe.ExpectColumnValuesToNotMatchRegex(column=col,
                                                                   regex=r"^\s*$"))
    suite.add_expectation(gxe.ExpectColumnValuesToBeBetween(
        column="prompt_tokens", min_value=1, max_value=cfg.max_prompt_tokens))
    for col in TEXT_FIELDS[kind]:
        suite.add_expectation(gxe.ExpectColumnValuesToBeBetween(
            column=f"{col}_tokens", min_value=1, max_value=cfg.max_response_tokens))
    if kind == "preference":
        suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(
            column="chosen_equals_rejected", value_set=[False]))
        suite.add_expectation(gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["prompt", "chosen", "rejected"]))
    return suite


def _gx_context():
    """In-memory GX context: no default docs site, no "Calculating Metrics" progress bars."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    return gx.get_context(mode="ephemeral", project_config=DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        progress_bars=ProgressBarsConfig(globally=False)))


def _label(name: str, paths: dict[str, str]) -> str:
    return f"{name} ({paths[name]})" if name in paths else name


def _kind(name: str) -> str:
    """Frame name (sft, preference, prompts, eval_prompts, preference_eval) -> its schema."""
    return "preference" if name.startswith("preference") else \
        "sft" if name == "sft" else "prompts"


def run_suites(frames: dict[str, pd.DataFrame], tokens: dict[str, Tokenized],
               cfg: ValidationConfig, report: ValidationReport,
               paths: dict[str, str] | None = None) -> None:
    """One GX validation definition per data set (``tokens``: each one's, row for row);
    results kept in the context's store."""
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier

    context = _gx_context()
    source = context.data_sources.add_pandas("rlhf")
    run_id = RunIdentifier(run_name="rlhf-validate")  # one run id for every data set
    for name, df in frames.items():
        kind = _kind(name)
        checked = _with_checks(df, kind, tokens[name])
        batch_def = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe(name)
        suite = context.suites.add(build_suite(kind, cfg)) if f"rlhf_{kind}" not in \
            [s.name for s in context.suites.all()] else context.suites.get(f"rlhf_{kind}")
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=name, data=batch_def, suite=suite))
        result = definition.run(batch_parameters={"dataframe": checked}, run_id=run_id,
                                result_format={"result_format": "COMPLETE"})
        report.results_json[name] = result.to_json_dict()
        for r in result.results:
            if not r.success:
                report.failures.append(failure_sentence(name, (paths or {}).get(name), r,
                                                        checked, cfg.example_rows))
        report.stats[f"{name}/n_rows"] = float(len(df))
    report.gx_context = context


def _median_response_length(tokens: Tokenized, col: str) -> float:
    return float(pd.Series(tokens.lengths(col)).median())


def validate_datasets(frames: dict[str, pd.DataFrame], tokenizer, cfg: ValidationConfig,
                      paths: dict[str, str] | None = None, chat: dict | None = None):
    """Budgets, then the GX suites, then fraction and length-mismatch checks.

    Args: frames keyed sft / preference / prompts (/ eval_prompts / preference_eval); paths:
    the file of each (named in failures); chat: set when the frames are rendered conversations.
    Returns: (report, cleaned frames, their tokens row for row).
    """
    paths = paths or {}
    report = ValidationReport(chat=dict(chat or {}))
    cleaned, kept_tokens = {}, {}
    for name, df in frames.items():
        tokens = tokenize_frame(df, tokenizer)  # the one pass over this set's texts
        check_text(_label(name, paths), df, tokens, tokenizer, cfg, report, bool(chat))
        if (repeated := duplicate_rows(_label(name, paths), df, _kind(name))) is not None:
            report.warnings.append(repeated)
        kept, kept_tokens[name], counts = apply_length_budget(df, tokens, _kind(name),
                                                              tokenizer, cfg, not chat)
        cleaned[name] = kept
        report.stats.update(counts.stats(name))
        label, kept_n = _label(name, paths), len(kept)
        if counts.truncated_fraction > cfg.max_truncated_fraction:
            report.failures.append(
                f"{label}: {counts.truncated_fraction:.3f} of the {name} rows had their "
                f"prompt cut to the token budget, more than validation.max_truncated_fraction "
                f"{cfg.max_truncated_fraction} (truncated fraction)")
        if counts.dropped_fraction > cfg.max_dropped_fraction:
            report.failures.append(
                f"{label}: {counts.dropped_fraction:.3f} of the {name} rows were dropped as "
                f"over the token budget ({kept_n} kept), more than validation.max_dropped_fraction "
                f"{cfg.max_dropped_fraction} (dropped fraction {counts.dropped_fraction:.3f})"
                + (_chat_budget_hint(tokens, cfg) if chat else ""))
    run_suites(cleaned, kept_tokens, cfg, report, paths)
    if len(cleaned["sft"]) and len(cleaned["preference"]):
        sft_len = _median_response_length(kept_tokens["sft"], "response")
        pref_len = _median_response_length(kept_tokens["preference"], "chosen")
        ratio = max(sft_len, pref_len) / max(min(sft_len, pref_len), 1.0)
        report.stats["length_mismatch_ratio"] = ratio
        if ratio > cfg.length_mismatch_warn_ratio:
            report.warnings.append(f"median response length: SFT {sft_len:g} vs preference "
                                   f"(chosen) {pref_len:g} tokens, ratio {ratio:.2f}")
    report.passed = not report.failures
    return report, cleaned, kept_tokens


def _chat_budget_hint(tokens: Tokenized, cfg: ValidationConfig) -> str:
    """Where a rendered prompt is over budget: its row, its tokens with the template's, and
    the fix (a cut would drop the template's assistant header, so none is made)."""
    lengths = tokens.lengths("prompt").tolist()
    over = [i for i, n in enumerate(lengths) if n > cfg.max_prompt_tokens]
    if not over:
        return ""
    return (f"; e.g. row {over[0] + 1}: its rendered prompt has {lengths[over[0]]} tokens, "
            "template included, and a cut would remove the template's assistant header, so "
            "conversations are never cut: raise validation.max_prompt_tokens or shorten them")


def run_validation(data: DataConfig, tokenizer, cfg: ValidationConfig, out_dir,
                   chat=None, cache=None) -> ValidationReport:
    """Load every source, validate, write cleaned JSONL files into ``out_dir``, each with its
    token ids beside it (data_checks/token_files.py).

    ``chat``: the conversation renderer (rlhf_core/models/chat.py), used when any data set is
    conversational: every data set is then rendered with the tokenizer's chat template, whose
    EOS becomes the template's end-of-turn token (``report.chat`` says what changed).
    ``cache``: where passed validations are kept and reused (data_checks/cache.py; None:
    always run the suites).
    Raises DataError for malformed files; failed expectations come back in the report.
    """
    from data_checks import cache as kept

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sources = {name: (getattr(data, name), kind) for name, kind in KINDS.items()}
    paths = {name: src.path for name, (src, _) in sources.items() if src}
    key = cache and kept.validation_key({n: s for n, (s, _) in sources.items() if s},
                                        tokenizer, cfg, chat is not None)
    if key and (hit := kept.load(cache, key, paths, out)):
        forget_reads()
        fields, gx_docs = hit
        return ValidationReport(warnings=fields["warnings"], stats=fields["stats"],
                                results_json=fields["results_json"], chat=fields["chat"],
                                gx_docs=gx_docs, reused=key)
    try:
        frames = {name: take_read(src, kind) for name, (src, kind) in sources.items() if src}
    finally:
        forget_reads()
    try:
        frames, chat_info = render_conversations(frames, {n: k for n, (_, k) in sources.items()},
                                                 tokenizer, chat, paths)
    except ConversationError as err:
        raise DataError(str(err)) from None
    report, cleaned, tokens = validate_datasets(frames, tokenizer, cfg, paths, chat_info)
    if report.passed:
        for name, df in cleaned.items():
            write_cleaned(df, out / f"{name}.jsonl")
            write_tokens(tokens[name].table, tokens_path(out / f"{name}.jsonl"))
        # kept once its Data Docs are built (write_data_docs), if it still passes; never
        # conversational data, whose rendering also changes the tokenizer's EOS
        if key and not report.chat:
            report.to_keep = (cache, key, paths, out)
    return report


def write_cleaned(df: pd.DataFrame, path: Path, rows: int = 2_000) -> None:
    """``df.to_json(path, orient="records", lines=True)``, byte for byte, ``rows`` at a time
    (pandas builds the whole text in memory first: 0.5 GB at 200k pairs)."""
    with open(path, "w", encoding="utf-8") as fh:
        for start in range(0, max(len(df), 1), rows):  # an empty frame writes one newline
            fh.write(df.iloc[start: start + rows].to_json(orient="records", lines=True,
                                                          force_ascii=False))


def build_gx_docs(context, site_dir: Path) -> Path:
    """GX's own Data Docs site (index, one page per suite and per validation) in ``site_dir``,
    rendered from the validation results ``context`` stores."""
    if site_dir.exists():
        shutil.rmtree(site_dir)
    site = {"class_name": "SiteBuilder", "show_how_to_buttons": False,
            "store_backend": {"class_name": "TupleFilesystemStoreBackend",
                              "base_directory": str(site_dir.resolve())},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"}}
    if "rlhf" in context.get_site_names():
        context.update_data_docs_site("rlhf", site)
    else:
        context.add_data_docs_site("rlhf", site)
    context.build_data_docs(site_names=["rlhf"])
    for decoration in (site_dir / "static").rglob("*"):  # 4 MB of stock GIFs and fonts
        if decoration.suffix in (".gif", ".otf"):
            decoration.unlink()
    return site_dir / "index.html"


def write_data_docs(report: ValidationReport, out_dir) -> Path:
    """``results.json``, GX's Data Docs under ``gx/`` and a one-page summary ``index.html``
    (every expectation and its outcome, plus the budget failures GX does not see)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report.results_json, indent=1, default=str))
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
