"""The data gate: length budgets, great-expectations suites, a report, cleaned JSONL files.

It streams CHUNK_ROWS rows at a time: each chunk is tokenized once, checked, cut to the budget,
validated by the whole GX suite and written before the next is read, so memory stays flat as the
data grows. The chunks' GX results merge into one per data set (data_checks/suites.py), with
uniqueness across chunks recomputed from row hashes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from data_checks.budget import TEXT_FIELDS, BudgetCounts, apply_length_budget
from data_checks.config import DataConfig, ValidationConfig
from data_checks.conversations import (
    ConversationError,
    is_conversational,
    render_chunks,
    start_chat,
)
from data_checks.data_docs import write_data_docs  # noqa: F401  (re-exported)
from data_checks.errors import ValidationFailed  # noqa: F401  (re-exported)
from data_checks.files import write_cleaned
from data_checks.loading import KINDS, DataError, forget_reads, take_chunks
from data_checks.messages import example_row, example_rows
from data_checks.report import ValidationReport
from data_checks.suites import (
    kind_of,
    one_page_per_set,
    suite_context,
    suite_for,
)
from data_checks.text_checks import Repeats, TextTally
from data_checks.token_files import ChunkTokens, TokenWriter, tokens_path, write_tokens
from data_checks.tokens import Tokenized, frame_texts, tokenize_frame

CHUNK_ROWS = 25_000  # rows of a data set read, tokenized, checked and written at a time
DROPPED_SHOWN = 1_000  # dropped rows kept per data set for the Data Docs (all are counted)
CHUNKS = ".chunks"  # the folder (in the cleaned files' one) of a running gate's chunk tokens


def _with_checks(df: pd.DataFrame, kind: str, tokens: Tokenized) -> pd.DataFrame:
    """Derived columns the suites check: token lengths (responses with EOS), chosen == rejected."""
    checks = {"prompt_tokens": tokens.lengths("prompt"),
              **{f"{col}_tokens": tokens.lengths(col) + 1 for col in TEXT_FIELDS[kind]}}
    if kind == "preference":
        checks["chosen_equals_rejected"] = df["chosen"] == df["rejected"]
    return df.assign(**checks)  # the text is shared with df, not copied


def _label(name: str, paths: dict[str, str]) -> str:
    return f"{name} ({paths[name]})" if name in paths else name


def _median_response_length(lengths: list[np.ndarray]) -> float:
    return float(pd.Series(np.concatenate(lengths) if lengths else []).median())


@dataclass
class _Cleaned:
    """One data set's cleaned rows and token ids, written beside their real names until the
    validation passes (a failed or killed gate leaves no cleaned file)."""

    path: Path
    rows: int = 0
    empty: tuple | None = None  # an empty chunk's (rows, tokens): what an empty set writes

    def __post_init__(self):
        self.part = self.path.with_name(self.path.name + ".part")
        self.part.write_text("", encoding="utf-8")
        self.tokens = TokenWriter(tokens_path(self.path))

    def write(self, kept: pd.DataFrame, tokens: Tokenized) -> None:
        if len(kept):
            write_cleaned(kept, self.part, append=True)
            self.tokens.write(tokens.table)
            self.rows += len(kept)
        else:
            self.empty = (kept, tokens)

    def finish(self) -> None:
        if not self.rows and self.empty is not None:  # as one write of the empty set gives
            write_cleaned(self.empty[0], self.part, append=True)
            self.tokens.__exit__(ValueError, None, None)
            write_tokens(self.empty[1].table, tokens_path(self.path))
        else:
            self.tokens.close()
        self.part.replace(self.path)

    def discard(self) -> None:
        self.part.unlink(missing_ok=True)
        self.tokens.__exit__(ValueError, None, None)


def _note_dropped(dropped: dict[str, list[dict]], name: str, df: pd.DataFrame,
                  kept: np.ndarray) -> None:
    """Keep the rows of ``df`` not in ``kept`` (positions), up to DROPPED_SHOWN, numbered."""
    shown = dropped.setdefault(name, [])
    room = DROPPED_SHOWN - len(shown)
    if room <= 0 or len(kept) == len(df):
        return
    gone = np.setdiff1d(np.arange(len(df)), kept)[:room]
    rows = df.iloc[gone].to_dict(orient="records")
    shown += [{"row": int(df.index[i]) + 1, **row} for i, row in zip(gone, rows)]


def _cut_rows(kept: pd.DataFrame, tokens: Tokenized) -> np.ndarray:
    """Positions in ``kept`` of the rows the budget cut (a prompt or a response)."""
    cut = np.zeros(len(kept), dtype=bool)
    for column in tokens.table.column_names:
        if column.endswith("_cut"):
            cut |= tokens.table.column(column).to_numpy(zero_copy_only=False)
    return np.flatnonzero(cut)


def _e_g(examples: list[str]) -> str:
    return f"; e.g. {'; '.join(examples)}" if examples else ""


def _tokenize(df: pd.DataFrame, tokenizer, store: ChunkTokens | None,
              report: ValidationReport) -> Tokenized:
    """A chunk, tokenized, or its tokens as an earlier (or a killed) gate kept them."""
    texts = frame_texts(df) if store is not None else {}
    table = store.get(key := store.key(texts)) if texts else None
    if table is not None:
        report.chunks_kept += 1
        return Tokenized(table, tuple(texts))
    report.chunks_tokenized += 1
    tokens = tokenize_frame(df, tokenizer)
    if texts:
        store.put(key, tokens.table)
    return tokens


def validate_datasets(chunks: dict[str, Iterable[pd.DataFrame]], tokenizer,
                      cfg: ValidationConfig, paths: dict[str, str] | None = None,
                      chat: dict | None = None, out_dir: Path | None = None,
                      chunk_tokens: ChunkTokens | None = None):
    """The report on each data set's chunks (text checks, budget, GX suite), then the fraction
    and length-mismatch checks over whole sets. Cleaned files go to ``out_dir`` only if it
    passes; ``chunk_tokens`` keeps each chunk's tokens so a rerun after a kill reuses them."""
    paths = paths or {}
    report = ValidationReport(chat=dict(chat or {}))
    context, source, run_id = suite_context()
    suites, n_rows, medians, sinks = [], {}, {"sft": [], "preference": []}, []
    try:
        for name, parts in chunks.items():
            kind, label = kind_of(name), _label(name, paths)
            tally = TextTally(label, kind, tokenizer, cfg, bool(chat))
            suite = suite_for(context, source, run_id, name, cfg, label)
            sink = _Cleaned(Path(out_dir) / f"{name}.jsonl") if out_dir is not None else None
            sinks.append(sink)
            n_in = n_cut = n_kept = 0
            hint, cut_examples = "", []
            pairs = Repeats(("prompt", "chosen", "rejected"), cfg.example_rows)
            for df in parts:  # indexed by the rows' places in the file (loading.py)
                tokens = _tokenize(df, tokenizer, chunk_tokens, report)  # the one pass
                tally.add(df, tokens)
                if chat and not hint:
                    hint = _chat_budget_hint(tokens, cfg, df.index)
                kept, kept_tokens, counts = apply_length_budget(df, tokens, kind, tokenizer,
                                                                cfg, not chat)
                _note_dropped(report.dropped, name, df, kept.index.to_numpy())
                kept.index = df.index[kept.index.to_numpy()]  # the rows' places, for messages
                if len(cut_examples) < cfg.example_rows:
                    cut = kept.index[_cut_rows(kept, kept_tokens)].tolist()
                    cut_examples += example_rows(kept, cut, cfg.example_rows - len(cut_examples))
                suite.run(_with_checks(kept, kind, kept_tokens), n_in)
                if kind == "preference":
                    pairs.add(kept)
                if name in medians:
                    medians[name].append(kept_tokens.lengths(
                        "response" if name == "sft" else "chosen"))
                if sink is not None:
                    sink.write(kept, kept_tokens)
                n_in += counts.n_in
                n_cut += counts.n_truncated
                n_kept += len(kept)
            tally.report(report)
            counts = BudgetCounts(n_in, n_cut, n_in - n_kept)
            report.stats.update(counts.stats(name))
            if counts.truncated_fraction > cfg.max_truncated_fraction:
                report.failures.append(
                    f"{label}: {counts.truncated_fraction:.3f} of the {name} rows had their "
                    f"prompt cut to the token budget, more than validation.max_truncated_"
                    f"fraction {cfg.max_truncated_fraction} (truncated fraction)"
                    + _e_g(cut_examples))
            if counts.dropped_fraction > cfg.max_dropped_fraction:
                report.failures.append(
                    f"{label}: {counts.dropped_fraction:.3f} of the {name} rows were dropped as "
                    f"over the token budget ({n_kept} kept), more than validation.max_dropped_"
                    f"fraction {cfg.max_dropped_fraction} (dropped fraction "
                    f"{counts.dropped_fraction:.3f})" + (hint or _e_g(
                        _dropped_examples(report.dropped.get(name, []), cfg.example_rows))))
            repeated = pairs.labels() if pairs.chunks > 1 else None
            suites.append((suite, suite.merged(repeated, pairs.examples)))
            n_rows[name] = n_kept
        for suite, merged in suites:
            report.results_json[suite.name] = merged
            report.failures += suite.failures(merged)
            report.stats[f"{suite.name}/n_rows"] = float(n_rows[suite.name])
        one_page_per_set(context, suites)
        report.gx_context = context
        if n_rows.get("sft") and n_rows.get("preference"):
            sft_len = _median_response_length(medians["sft"])
            pref_len = _median_response_length(medians["preference"])
            ratio = max(sft_len, pref_len) / max(min(sft_len, pref_len), 1.0)
            report.stats["length_mismatch_ratio"] = ratio
            if ratio > cfg.length_mismatch_warn_ratio:
                report.warnings.append(f"median response length: SFT {sft_len:g} vs "
                                       f"preference (chosen) {pref_len:g} tokens, ratio "
                                       f"{ratio:.2f}")
        report.passed = not report.failures
    except BaseException:
        for sink in sinks:
            if sink is not None:
                sink.discard()
        raise
    for sink in sinks:
        if sink is not None:
            sink.finish() if report.passed else sink.discard()
    return report


def _dropped_examples(dropped: list[dict], n: int) -> list[str]:
    """'row 7: {...}' of the first ``n`` rows the budget dropped (_note_dropped)."""
    return [example_row(row["row"], row) for row in dropped[:n]]


def _chat_budget_hint(tokens: Tokenized, cfg: ValidationConfig, labels: pd.Index) -> str:
    """Where a rendered prompt is over budget: its row, its tokens with the template's, and
    the fix (a cut would drop the template's assistant header, so none is made)."""
    lengths = tokens.lengths("prompt").tolist()
    over = [i for i, n in enumerate(lengths) if n > cfg.max_prompt_tokens]
    if not over:
        return ""
    row = int(labels[over[0]]) + 1
    return (f"; e.g. row {row}: its rendered prompt has {lengths[over[0]]} tokens, "
            "template included, and a cut would remove the template's assistant header, so "
            "conversations are never cut: raise validation.max_prompt_tokens or shorten them")


def run_validation(data: DataConfig, tokenizer, cfg: ValidationConfig, out_dir,
                   chat=None, cache=None) -> ValidationReport:
    """Load every source, validate, write cleaned JSONL files and their token ids to ``out_dir``.
    ``chat`` renders conversational data with the chat template; ``cache`` reuses passed gates and
    kept chunk tokens. Raises DataError for malformed files; failures come back in the report."""
    from data_checks import cache as kept

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.part"):  # a killed gate's unfinished files (_Cleaned)
        stale.unlink()
    sources = {name: (getattr(data, name), kind) for name, kind in KINDS.items()}
    paths = {name: src.path for name, (src, _) in sources.items() if src}
    key = cache and kept.validation_key({n: s for n, (s, _) in sources.items() if s},
                                        tokenizer, cfg, chat is not None)
    if key and (hit := kept.load(cache, key, paths, out)):
        forget_reads()
        fields, gx_docs = hit
        if fields["chat"]:  # the tokenizer as the kept gate left it: EOS its end-of-turn
            chat.prepare_chat(tokenizer)
        return ValidationReport(warnings=fields["warnings"], stats=fields["stats"],
                                results_json=fields["results_json"], chat=fields["chat"],
                                dropped=fields.get("dropped", {}), gx_docs=gx_docs,
                                reused=key)
    try:
        chunks = {name: take_chunks(src, kind, CHUNK_ROWS) for name, (src, kind) in
                  sources.items() if src}
        firsts = {name: next(parts, None) for name, parts in chunks.items()}
    finally:
        forget_reads()
    parts = {name: _prepend(firsts[name], chunks[name]) for name in chunks}
    chatty = [n for n, df in firsts.items() if df is not None and is_conversational(df)]
    chat_info = {}
    if chatty:  # every set rendered with the template, chunk by chunk, once EOS is moved
        try:
            chat_info = start_chat(tokenizer, chat, paths.get(chatty[0], chatty[0]))
        except ConversationError as err:
            raise DataError(str(err)) from None
        parts = {name: _rendered(render_chunks(rows, sources[name][1], tokenizer, chat,
                                               chat_info, paths.get(name, name), name in chatty))
                 for name, rows in parts.items()}
    identity = kept.encoding_identity(tokenizer)
    folder = kept.chunk_folder(cache) if cache is not None else out / CHUNKS
    chunk_tokens = ChunkTokens(folder, identity) if identity is not None else None
    report = validate_datasets(parts, tokenizer, cfg, paths, chat_info, out, chunk_tokens)
    if chunk_tokens is not None and cache is None:  # a verdict: nothing left to resume
        chunk_tokens.clear()
    # kept once write_data_docs has built its Data Docs, if it still passes
    if report.passed and key:
        report.to_keep = (cache, key, paths, out)
    return report


def _rendered(items: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Rendered chunks; a ConversationError becomes a DataError naming the file and the row."""
    try:
        yield from items
    except ConversationError as err:
        raise DataError(str(err)) from None


def _prepend(first: pd.DataFrame | None, rest: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    if first is not None:
        yield first
    yield from rest
