"""Labelled files coming back from labellers: rows checked against the collection they came
from, votes counted, and the figures that say whether the labels can be trusted.

A labelling file has one row per (pair, labeller): ``id``, ``choice`` (a | b | tie | skip),
optionally ``labeller``; the other columns (prompt, responses, sampling settings) are for the
labeller and are not read back: the pair's texts come from the collection's own record, so
an edited response cannot slip into training. Several rows with one id are several
labellers: the majority of their non-skip votes decides (an even split is a tie).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from data_checks.files import FileError, file_format, read_local
from data_checks.loading import DataError

CHOICES = ("a", "b", "tie", "skip")
SHOWN_ERRORS = 5


def read_labelled(path: str | Path) -> pd.DataFrame:
    """A labelled file (.jsonl/.json/.csv/.parquet) -> its rows as text; DataError names
    the file when it cannot be read or has no ``id``/``choice`` column."""
    path = Path(path)
    fmt, compression = file_format(path)
    if fmt is None:
        raise DataError(f"{path}: unknown labelled file type (use .jsonl, .json, .csv or "
                        ".parquet)")
    try:
        df = read_local(path, fmt, compression)
    except FileError as err:
        raise DataError(str(err)) from None
    except Exception as err:  # noqa: BLE001 - pandas/pyarrow raise many types
        raise DataError(f"{path}: cannot read as {fmt} ({type(err).__name__}: {err})") from None
    missing = [c for c in ("id", "choice") if c not in df.columns]
    if missing:
        raise DataError(f"{path}: no {' or '.join(missing)} column (a labelled file has id, "
                        f"choice ({'/'.join(CHOICES)}) and optionally labeller)")
    return df


def is_labelled(path: str | Path) -> bool:
    """Whether a file in the watch folder is a labelled file (has id and choice columns)
    rather than a preference batch."""
    try:
        read_labelled(path)
    except DataError:
        return False
    return True


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) \
        else str(value).strip()


def check_rows(df: pd.DataFrame, path: str | Path, known_ids: set[str]) -> list[dict]:
    """Every row -> {row, id, choice, labeller}; rows with a missing or unknown choice, or an
    id no collection wrote, are refused together in one DataError naming file and rows
    (1-based data rows)."""
    rows, errors = [], []
    has_labeller = "labeller" in df.columns
    for n, rec in enumerate(df.to_dict("records"), start=1):
        pid, choice = _text(rec.get("id")), _text(rec.get("choice")).lower()
        if pid not in known_ids:
            errors.append(f"row {n}: id '{pid}' is not from a collection")
        elif not choice:
            errors.append(f"row {n}: no choice (expected {', '.join(CHOICES)})")
        elif choice not in CHOICES:
            errors.append(f"row {n}: choice '{choice}' is not one of {', '.join(CHOICES)}")
        labeller = _text(rec.get("labeller")) if has_labeller else ""
        rows.append({"row": n, "id": pid, "choice": choice, "labeller": labeller or "unnamed"})
    if errors:
        more = f" (and {len(errors) - SHOWN_ERRORS} more)" if len(errors) > SHOWN_ERRORS else ""
        raise DataError(f"{path}: {len(errors)} row(s) refused, nothing imported: "
                        f"{'; '.join(errors[:SHOWN_ERRORS])}{more}")
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def majority(rows: Sequence[dict]) -> dict[str, dict]:
    """Votes per pair -> {id: {choice, votes, top}}: the most frequent non-skip choice (an
    even split between the top choices is 'tie'); all skips -> 'skip'."""
    by_id: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        by_id[r["id"]].append(r["choice"])
    out = {}
    for pid, choices in by_id.items():
        counts = Counter(c for c in choices if c != "skip")
        if not counts:
            out[pid] = {"choice": "skip", "votes": 0, "top": 0}
            continue
        (best, top), *rest = counts.most_common()
        tied = bool(rest) and rest[0][1] == top
        out[pid] = {"choice": "tie" if tied else best, "votes": sum(counts.values()),
                    "top": top}
    return out


def agreement_rate(decided: Mapping[str, dict]) -> float | None:
    """Over pairs with two or more non-skip votes: the mean share of votes that went to the
    most frequent choice (None when no pair had two labellers)."""
    shares = [d["top"] / d["votes"] for d in decided.values() if d["votes"] >= 2]
    return sum(shares) / len(shares) if shares else None


def _share(hits: Sequence[bool]) -> float | None:
    return sum(hits) / len(hits) if hits else None


def label_figures(rows: Sequence[dict], decided: Mapping[str, dict],
                  records: Mapping[str, dict]) -> dict:
    """Label quality: the batch's and each labeller's agreement with the known answers (a/b
    votes on known-answer pairs), the batch's agreement with the policy's reward model (its
    scores of the two responses, on the other pairs) and the labellers' agreement rate."""
    known = {pid: rec["known"] for pid, rec in records.items() if rec.get("known")}
    batch_known = [decided[p]["choice"] == known[p] for p in decided
                   if p in known and decided[p]["choice"] in ("a", "b")]
    per_labeller: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        if r["id"] in known and r["choice"] in ("a", "b"):
            per_labeller[r["labeller"]].append(r["choice"] == known[r["id"]])
    rm_hits = []
    for pid, d in decided.items():
        rec = records[pid]
        if pid in known or d["choice"] not in ("a", "b") or rec.get("rm_a") == rec.get("rm_b"):
            continue
        rm_hits.append(d["choice"] == ("a" if rec["rm_a"] > rec["rm_b"] else "b"))
    return {"known_labelled": len(batch_known), "known_agreement": _share(batch_known),
            "rm_pairs": len(rm_hits), "rm_agreement": _share(rm_hits),
            "agreement_rate": agreement_rate(decided),
            "labeller_known_agreement": {k: _share(v) for k, v in sorted(per_labeller.items())}}


def preference_rows(decided: Mapping[str, dict], records: Mapping[str, dict]
                    ) -> tuple[list[dict], dict[str, int]]:
    """The decided pairs -> preference rows (prompt, chosen, rejected) and counts; ties,
    skips and the known-answer pairs are left out (known answers never train)."""
    out, counts = [], {"pairs": 0, "ties": 0, "skips": 0, "known": 0}
    for pid in sorted(decided):
        rec, choice = records[pid], decided[pid]["choice"]
        if rec.get("known"):
            counts["known"] += 1
        elif choice in ("tie", "skip"):
            counts["ties" if choice == "tie" else "skips"] += 1
        else:
            a, b = rec["response_a"], rec["response_b"]
            chosen, rejected = (a, b) if choice == "a" else (b, a)
            out.append({"prompt": rec["prompt"], "chosen": chosen, "rejected": rejected})
            counts["pairs"] += 1
    return out, counts


def quality_refusal(figures: Mapping, min_known: float, min_known_labelled: int,
                    usual_rm: float | None, max_rm_drop: float) -> str | None:
    """One sentence saying why a batch is quarantined, with its figures; None: it passes.
    The reward-model agreement is judged against the usual rate of earlier accepted batches
    (``usual_rm``; none yet: not judged): on-policy labels are meant to disagree with the
    reward model where the policy exploits it, so only a fall far below the usual counts."""
    why = []
    k = figures["known_agreement"]
    if k is not None and figures["known_labelled"] >= min_known_labelled and k < min_known:
        why.append(f"agreement with the known answers {k:.2f} on {figures['known_labelled']} "
                   f"pairs is below {min_known}")
    r = figures["rm_agreement"]
    if r is not None and usual_rm is not None and r < usual_rm - max_rm_drop:
        why.append(f"agreement with the policy's reward model {r:.2f} on {figures['rm_pairs']} "
                   f"pairs is more than {max_rm_drop} below the usual {usual_rm:.2f}")
    return "; ".join(why) or None
