"""The data gate: length budgets, great-expectations suites, a report, cleaned JSONL files.

It streams CHUNK_ROWS rows at a time, so memory stays flat as the data grows: each chunk is
tokenized once, checked, cut to the budget, validated by the GX suite and written before the next
is read; the chunks' GX results merge into one per data set.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path

import numpy as np
import pandas as pd

from data_checks import cache as kept
from data_checks.adapters import TEXT_FIELDS, is_conversational, render_chunks, start_chat
from data_checks.config import DataConfig, ValidationConfig
from data_checks.errors import DataError, ValidationFailed  # noqa: F401  (re-exported)
from data_checks.files import write_cleaned
from data_checks.loading import KINDS, forget_reads, take_chunks
from data_checks.report import ValidationReport, write_data_docs  # noqa: F401  (re-exported)
from data_checks.suites import (
    e_g,
    example_row,
    example_rows,
    one_page_per_set,
    suite_context,
    suite_for,
)
from data_checks.text_checks import Repeats, TextTally
from data_checks.tokens import (
    Tokenized,
    TokenWriter,
    encode_batch,
    frame_texts,
    tokenize_frame,
    tokens_path,
)

CHUNK_ROWS = 25_000  # rows of a data set read, tokenized, checked and written at a time
DROPPED_SHOWN = 1_000  # dropped rows kept per data set for the Data Docs (all are counted)
CHUNKS = ".chunks"  # the folder (in the cleaned files' one) of a running gate's chunk tokens
PAD_TOKEN = "<|pad|>"


def ensure_special_tokens(tokenizer) -> dict:
    """EOS must exist; PAD must exist and differ from EOS (an EOS masked as padding is never
    learned), else a dedicated pad token is added -> what the tokenizer's special tokens are."""
    if tokenizer.eos_token_id is None:
        raise DataError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r}: no EOS token")
    added = tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id
    before, vocab = tokenizer.pad_token, len(tokenizer)
    if added:
        tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
        why = "it had none" if before is None else f"its PAD was its EOS {before!r}"
        grows = f"{vocab} -> {len(tokenizer)}" if len(tokenizer) > vocab else "unchanged"
        print(f"validate: the tokenizer gets a dedicated PAD {tokenizer.pad_token!r} (id "
              f"{tokenizer.pad_token_id}) because {why}, and an EOS masked as padding is "
              f"never learned; the models' vocabulary: {grows} rows (a new embedding row "
              "is drawn from the others' mean and covariance)", flush=True)
    return {"pad_added": added, "pad_token": tokenizer.pad_token,
            "pad_token_id": tokenizer.pad_token_id, "eos_token": tokenizer.eos_token,
            "eos_token_id": tokenizer.eos_token_id}


def cut_at_paragraph(prompt: str, tokenizer, max_tokens: int) -> str | None:
    """The longest head of ``prompt`` ending before a newline that fits the budget, else None."""
    cut = prompt.rfind("\n")
    while cut > 0:
        head = prompt[:cut]
        if len(encode_batch(tokenizer, [head])[0]) <= max_tokens:
            return head
        cut = prompt.rfind("\n", 0, cut)
    return None


def apply_length_budget(df: pd.DataFrame, tokens: Tokenized, kind: str, tokenizer,
                        cfg: ValidationConfig, cut_prompts: bool = True):
    """-> (kept rows indexed by their position in ``df``, their tokens, how many were cut).
    Long prompts are cut at paragraphs (dropped without ``cut_prompts``: a rendered conversation
    would lose its assistant header); long responses (+1: EOS) dropped or truncated."""
    is_text = df["prompt"].map(lambda v: isinstance(v, str)).to_numpy(dtype=bool)
    long = np.flatnonzero(is_text & (tokens.lengths("prompt") > cfg.max_prompt_tokens))
    keep = np.ones(len(df), dtype=bool)
    prompts = df["prompt"].tolist()
    cut_rows = []
    for i in long:
        head = cut_at_paragraph(prompts[i], tokenizer, cfg.max_prompt_tokens) \
            if cut_prompts else None
        if head is None:
            keep[i] = False
        else:
            cut_rows.append(i)
            prompts[i] = head
    truncated = len(cut_rows)
    df = df.assign(prompt=prompts)
    tokens = tokens.replace("prompt", np.array(cut_rows, dtype=np.int64),
                            [prompts[i] for i in cut_rows], tokenizer)
    for col in TEXT_FIELDS[kind]:
        over = tokens.lengths(col) + 1 > cfg.max_response_tokens
        if cfg.long_response_policy == "drop":
            keep &= ~over
            continue
        rows = np.flatnonzero(over)
        ids = tokens.table.column(f"{col}_ids").take(rows).to_pylist()
        texts = [tokenizer.decode(row[: cfg.max_response_tokens - 1]) for row in ids]
        values = df[col].tolist()
        for i, text in zip(rows, texts):
            values[i] = text
        df = df.assign(**{col: values})
        tokens = tokens.replace(col, rows, texts, tokenizer)
        truncated += len(rows)
    kept_rows = np.flatnonzero(keep)
    kept = df.iloc[kept_rows].set_axis(kept_rows)  # each row's position in ``df``
    return kept, tokens.take(kept_rows), truncated


def _with_checks(df: pd.DataFrame, kind: str, tokens: Tokenized) -> pd.DataFrame:
    """Derived columns the suites check: token lengths (responses with EOS), chosen == rejected."""
    checks = {"prompt_tokens": tokens.lengths("prompt"),
              **{f"{col}_tokens": tokens.lengths(col) + 1 for col in TEXT_FIELDS[kind]}}
    if kind == "preference":
        checks["chosen_equals_rejected"] = df["chosen"] == df["rejected"]
    return df.assign(**checks)  # the text is shared with df, not copied


@dataclass
class _Cleaned:
    """One data set's cleaned rows and token ids, written aside until the validation passes."""

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
            self.tokens.write(self.empty[1].table)
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


def _cut_rows(tokens: Tokenized) -> np.ndarray:
    """Positions of the rows the budget cut (a prompt or a response)."""
    cut = np.zeros(len(tokens), dtype=bool)
    for column in tokens.table.column_names:
        if column.endswith("_cut"):
            cut |= tokens.table.column(column).to_numpy(zero_copy_only=False)
    return np.flatnonzero(cut)


def _tokenize(df: pd.DataFrame, tokenizer, store: kept.ChunkTokens | None,
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
                      cfg: ValidationConfig, paths: dict[str, str], chat: dict, out_dir: Path,
                      chunk_tokens: kept.ChunkTokens | None):
    """The report on each data set's chunks (text checks, budget, GX suite) and on the whole
    sets; cleaned files go to ``out_dir`` only if it passes. ``chunk_tokens`` keeps each
    chunk's tokens so a rerun after a kill reuses them."""
    report = ValidationReport(chat=dict(chat))
    context, source, run_id = suite_context()
    suites, n_rows, medians, sinks = [], {}, {"sft": [], "preference": []}, []
    try:
        for name, parts in chunks.items():
            kind = KINDS[name]
            label = f"{name} ({paths[name]})" if name in paths else name
            tally = TextTally(label, kind, tokenizer, cfg, bool(chat))
            suite = suite_for(context, source, run_id, name, kind, cfg, label)
            sink = _Cleaned(out_dir / f"{name}.jsonl")
            sinks.append(sink)
            n_in = n_cut = n_kept = 0
            hint, cut_examples = "", []
            pairs = Repeats(("prompt", "chosen", "rejected"), cfg.example_rows)
            for df in parts:  # indexed by the rows' places in the file (loading.py)
                tokens = _tokenize(df, tokenizer, chunk_tokens, report)  # the one pass
                tally.add(df, tokens)
                if chat and not hint:
                    hint = _chat_budget_hint(tokens, cfg, df.index)
                kept, kept_tokens, cut = apply_length_budget(df, tokens, kind, tokenizer, cfg,
                                                             not chat)
                _note_dropped(report.dropped, name, df, kept.index.to_numpy())
                kept.index = df.index[kept.index.to_numpy()]  # the rows' places, for messages
                if len(cut_examples) < cfg.example_rows:
                    cut_examples += example_rows(kept, kept.index[_cut_rows(kept_tokens)].tolist(),
                                                 cfg.example_rows - len(cut_examples))
                suite.run(_with_checks(kept, kind, kept_tokens), n_in)
                if kind == "preference":
                    pairs.add(kept)
                if name in medians:
                    medians[name].append(kept_tokens.lengths(
                        "response" if name == "sft" else "chosen"))
                sink.write(kept, kept_tokens)
                n_in += len(df)
                n_cut += cut
                n_kept += len(kept)
            tally.report(report)
            truncated, dropped = n_cut / max(n_in, 1), (n_in - n_kept) / max(n_in, 1)
            report.stats.update({f"{name}/{k}": float(v) for k, v in (  # the stage's metrics
                ("n_in", n_in), ("n_truncated", n_cut), ("n_dropped", n_in - n_kept),
                ("truncated_fraction", truncated), ("dropped_fraction", dropped))})
            if truncated > cfg.max_truncated_fraction:
                report.failures.append(
                    f"{label}: {truncated:.3f} of the {name} rows had their prompt cut to the "
                    f"token budget, more than validation.max_truncated_fraction "
                    f"{cfg.max_truncated_fraction} (truncated fraction)" + e_g(cut_examples))
            if dropped > cfg.max_dropped_fraction:
                shown = report.dropped.get(name, [])[:cfg.example_rows]
                report.failures.append(
                    f"{label}: {dropped:.3f} of the {name} rows were dropped as over the token "
                    f"budget ({n_kept} kept), more than validation.max_dropped_fraction "
                    f"{cfg.max_dropped_fraction} (dropped fraction {dropped:.3f})"
                    + (hint or e_g([example_row(r["row"], r) for r in shown])))
            suites.append((suite, suite.merged(pairs.labels(), pairs.examples)))
            n_rows[name] = n_kept
        for suite, merged in suites:
            report.results_json[suite.name] = merged
            report.failures += suite.failures(merged)
            report.stats[f"{suite.name}/n_rows"] = float(n_rows[suite.name])
        one_page_per_set(context, suites)
        report.gx_context = context
        if n_rows.get("sft") and n_rows.get("preference"):
            sft_len, pref_len = (float(np.median(np.concatenate(medians[n])))
                                 for n in ("sft", "preference"))
            ratio = max(sft_len, pref_len) / max(min(sft_len, pref_len), 1.0)
            report.stats["length_mismatch_ratio"] = ratio
            if ratio > cfg.length_mismatch_warn_ratio:
                report.warnings.append(f"median response length: SFT {sft_len:g} vs "
                                       f"preference (chosen) {pref_len:g} tokens, ratio "
                                       f"{ratio:.2f}")
        report.passed = not report.failures
    except BaseException:
        for sink in sinks:
            sink.discard()
        raise
    for sink in sinks:
        sink.finish() if report.passed else sink.discard()
    return report


def _chat_budget_hint(tokens: Tokenized, cfg: ValidationConfig, labels: pd.Index) -> str:
    """Where a rendered prompt is over budget: its row, its tokens, and the fix."""
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
    """Load every source, validate, write cleaned JSONL files and their token ids to ``out_dir``
    (``chat`` renders conversations; ``cache`` reuses passed gates and tokenized chunks). Raises
    DataError for malformed files; failures come back in the report."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.part"):  # a killed gate's unfinished files (_Cleaned)
        stale.unlink()
    sources = {name: src for name in KINDS if (src := getattr(data, name)) is not None}
    paths = {name: src.path for name, src in sources.items()}
    key = cache and kept.validation_key(sources, tokenizer, cfg, chat is not None)
    if key and (hit := kept.load(cache, key, paths, out)):
        forget_reads()
        fields, gx_docs = hit
        if fields["chat"]:  # the tokenizer as the kept gate left it: EOS its end-of-turn
            chat.prepare_chat(tokenizer)
        restored = {name: fields[name] for name in ValidationReport().fields()}
        return ValidationReport(**restored, gx_docs=gx_docs, reused=key)
    try:
        chunks = {name: take_chunks(src, KINDS[name], CHUNK_ROWS)
                  for name, src in sources.items()}
        firsts = {name: list(islice(parts, 1)) for name, parts in chunks.items()}
    finally:
        forget_reads()
    parts = {name: chain(firsts[name], chunks[name]) for name in chunks}
    chatty = [n for n, first in firsts.items() if first and is_conversational(first[0])]
    chat_info = {}
    if chatty:  # every set rendered with the template, chunk by chunk, once EOS is moved
        chat_info = start_chat(tokenizer, chat, paths[chatty[0]])
        parts = {name: render_chunks(rows, KINDS[name], tokenizer, chat, chat_info, paths[name],
                                     name in chatty)
                 for name, rows in parts.items()}
    identity = kept.encoding_identity(tokenizer)
    folder = kept.chunk_folder(cache) if cache is not None else out / CHUNKS
    chunk_tokens = kept.ChunkTokens(folder, identity) if identity is not None else None
    report = validate_datasets(parts, tokenizer, cfg, paths, chat_info, out, chunk_tokens)
    if chunk_tokens is not None and cache is None:  # a verdict: nothing left to resume
        chunk_tokens.clear()
    # kept once write_data_docs has built its Data Docs, if it still passes
    if report.passed and key:
        report.to_keep = (cache, key, paths, out)
    return report
