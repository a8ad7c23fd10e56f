"""The stages' token ids: memory-mapped from the gate's token file beside a cleaned data set,
else encoded from the texts; either way the same ids."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from data_checks.tokens import read_tokens, tokens_path
from rlhf_core.models.data import encode
from rlhf_core.models.ragged import RaggedIds
from rlhf_core.train.reward import PairExamples, encode_pairs
from rlhf_core.train.sft import SFTExamples, encode_sft_rows
from tasks.platform.files import read_jsonl


def _ragged(column: pa.ChunkedArray) -> RaggedIds:
    """A list<int32> column -> its ids over the mapped buffers (no copy)."""
    return RaggedIds([(chunk.values.to_numpy(zero_copy_only=False),
                       chunk.offsets.to_numpy(zero_copy_only=False))
                      for chunk in column.chunks])


def read_ids(cleaned: Path | str, columns: tuple[str, ...]) -> list[RaggedIds] | None:
    """The gate's ids of ``columns`` of ``cleaned`` (None: no token file or columns); a row
    count mismatch is an error (it belongs to other data)."""
    cleaned = Path(cleaned)
    path = tokens_path(cleaned)
    if not path.is_file():
        return None
    table = read_tokens(path)
    if any(f"{c}_ids" not in table.column_names for c in columns):
        return None
    with open(cleaned, "rb") as fh:  # the rows read_jsonl reads: the non-blank lines
        n = sum(1 for line in fh if line.strip())
    if table.num_rows != n:
        raise ValueError(f"{path}: {table.num_rows} rows of token ids for the {n} rows of "
                         f"{cleaned}: it belongs to other data (delete it to tokenize again)")
    return [_ragged(table.column(f"{c}_ids")) for c in columns]


def text_ids(cleaned: Path | str, columns: tuple[str, ...], tokenizer) -> list[RaggedIds]:
    """The ids of ``columns`` of each row of ``cleaned``: the gate's, else encoded here."""
    ids = read_ids(cleaned, columns)
    if ids is not None:
        return ids
    rows = read_jsonl(cleaned)
    return [RaggedIds.from_lists([encode(tokenizer, r[c]) for r in rows]) for c in columns]


def sft_examples(cleaned: Path | str, tokenizer, loss_on: str) -> SFTExamples:
    """SFT's (input_ids, labels) per row of the cleaned SFT file."""
    ids = read_ids(cleaned, ("prompt", "response"))
    if ids is None:
        return encode_sft_rows(tokenizer, read_jsonl(cleaned), loss_on)
    return SFTExamples(*ids, tokenizer.eos_token_id, loss_on)


def preference_pairs(cleaned: Path | str, tokenizer) -> PairExamples:
    """The reward model's (chosen_ids, rejected_ids) per row of a cleaned preference file."""
    ids = read_ids(cleaned, ("prompt", "chosen", "rejected"))
    if ids is None:
        return encode_pairs(tokenizer, read_jsonl(cleaned))
    return PairExamples(*ids, tokenizer.eos_token_id)
