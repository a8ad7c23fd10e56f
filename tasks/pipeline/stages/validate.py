"""validate: the data gate. Nothing trains unless every expectation passes."""

from __future__ import annotations

import json
from pathlib import Path

from data_checks.cache import validation_cache
from data_checks.errors import ValidationFailed
from data_checks.loading import KINDS, DataError
from data_checks.validate import ensure_special_tokens, run_validation, write_data_docs
from rlhf_core.models import chat
from rlhf_core.models.loader import load_tokenizer
from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.prepare import Prepared
from tasks.pipeline.stages.context import Stage, StageContext
from tasks.pipeline.stages.records import DataRecord
from tasks.pipeline.stages.run import stage_task
from tasks.pipeline.stages.tax import check_tax_inputs
from tasks.platform.mlflow.runs import RunContext, run_url
from tasks.platform.mlflow.tags import DATA_DIGEST_PREFIX, TOKENIZER_PREFIX, VALIDATION_REUSED_TAG
from tasks.platform.prefect.prefect_api import in_prefect_run


def report_artifact(ctx: RunContext, run_id: str, report) -> None:
    """The gate's verdict in the Prefect UI, pass or fail, with where the Data Docs are."""
    if not in_prefect_run():
        return
    from prefect.artifacts import create_markdown_artifact

    where = (f"\n\nMLflow: {run_url(ctx, run_id)}; Data Docs: artifacts `data_docs/index.html`"
             " and `data_docs/gx/index.html`, results: `data_docs/results.json`\n")
    create_markdown_artifact(key="rlhf-data-validation", markdown=report.summary_markdown() + where,
                             description="data gate: expectations, failures, row counts")


def require_margin(report, cfg: PipelineConfig, cleaned_preference: Path) -> None:
    """reward.use_margin needs a margin column in the (cleaned) preference data."""
    if not cfg.reward.use_margin or not report.passed:
        return
    with open(cleaned_preference, encoding="utf-8") as fh:
        first = json.loads(fh.readline() or "{}")
    if "margin" not in first:
        report.failures.append(
            "preference: reward.use_margin is set but the preference data has no 'margin' "
            "column (add one, map one with column_map, or set reward.use_margin: false)")
        report.passed = False


def chat_template(value: str | None) -> str | None:
    """model.chat_template: a file holding a Jinja template, else the template itself."""
    if not value:
        return None
    path = Path(value).expanduser()
    if "{" not in value and not path.is_file():
        raise DataError(f"model.chat_template={value!r}: no such file, and not a Jinja "
                         "template (give a template string or the path of a file holding one)")
    return path.read_text(encoding="utf-8") if "{" not in value else value


SAMPLE_ROWS = 20  # rows of each cleaned set shown in data_docs/sample/


def body(sc: StageContext, prep: Prepared) -> DataRecord:
    """Load, check and clean the data; log GX results and Data Docs; stop on any failure."""
    cfg = sc.cfg
    check_tax_inputs(cfg)  # the alignment tax's probe and text, before any training
    tokenizer = load_tokenizer(prep.tokenizer, sc.spec)
    template = chat_template(cfg.model.chat_template)
    if template:
        tokenizer.chat_template = template
    record = ensure_special_tokens(tokenizer)
    out_dir = sc.dir
    report = run_validation(prep.data, tokenizer, cfg.validation, out_dir, chat=chat,
                            cache=validation_cache())
    if report.reused:
        sc.set_tags({VALIDATION_REUSED_TAG: report.reused})
    elif report.chunks_kept:
        print(f"validate: {report.chunks_line()}", flush=True)
    # conversational data: EOS is now the template's end-of-turn token
    record.update({"eos_token": tokenizer.eos_token, "eos_token_id": tokenizer.eos_token_id,
                   **{f"chat.{k}": v for k, v in report.chat.items()}})
    tokenizer.save_pretrained(out_dir / "tokenizer")
    sc.set_tags({TOKENIZER_PREFIX + k: str(v) for k, v in record.items()})
    require_margin(report, cfg, out_dir / "preference.jsonl")
    docs = write_data_docs(report, out_dir / "data_docs")
    for path in sorted(out_dir.glob("*.jsonl")):  # the first SAMPLE_ROWS rows of each set
        (docs / "sample").mkdir(parents=True, exist_ok=True)
        with open(path, encoding="utf-8") as fh:
            head = [line for _, line in zip(range(SAMPLE_ROWS), fh)]
        (docs / "sample" / path.name).write_text("".join(head), encoding="utf-8")
    sc.log_artifacts(docs, "data_docs")
    sc.log_text(report.summary_markdown(), "validation_summary.md")
    sc.log(0, report.stats)
    report_artifact(sc.run, sc.run_id, report)
    if not report.passed:  # the warnings too: the terminal shows this text whole
        raise ValidationFailed("data validation failed:\n" + "\n".join(
            report.failures + [f"warning: {w}" for w in report.warnings]))
    digests = {}
    for context, names in (("training", ("sft", "preference", "prompts")),
                           ("evaluation", ("eval_prompts", "preference_eval"))):
        files = {n: out_dir / f"{n}.jsonl" for n in names if (out_dir / f"{n}.jsonl").exists()}
        digests.update(sc.log_datasets(files, context))
    sc.set_tags({DATA_DIGEST_PREFIX + k: v for k, v in digests.items()}, parent=True)
    # the cleaned data, for other machines: every file while together small enough, else none
    cleaned = sorted(out_dir.glob("*.jsonl"))
    if sum(p.stat().st_size for p in cleaned) <= cfg.tracking.log_cleaned_data_max_mb * 2**20:
        for path in cleaned:
            sc.log_artifact(path, "data")
    tokenizer_art = sc.publish(out_dir / "tokenizer", "data/tokenizer")
    return DataRecord(
        data=sc.publish(out_dir, "data", logged=True), tokenizer=tokenizer_art,
        pad_added=bool(record.get("pad_added", False)), conversational=bool(report.chat),
        warnings=report.warnings,
        metrics={k: v for k, v in report.stats.items() if k.endswith("n_rows")},
        figures={f"{name}/expectations_passed": f"{ok}/{n}"
                 for name, (ok, n) in report.expectation_counts().items()})


# data/*.jsonl: the cleaned files, copied only while small (tracking.log_cleaned_data_max_mb)
COUNTS = ("n_rows", "n_in", "n_truncated", "n_dropped", "truncated_fraction", "dropped_fraction")
STAGE = Stage("validate", body, DataRecord, sections=("validation",),
              metrics=(*(f"{s}/{c}" for s in KINDS for c in COUNTS), "length_mismatch_ratio"),
              artifacts=("data", "data/*.jsonl", "data/tokenizer", "data_docs",
                         "validation_summary.md"))
validate = stage_task(STAGE)
