"""Tokenizer checks: EOS must exist; PAD must exist and differ from EOS (an EOS masked as
padding is never learned), else a dedicated pad token is added and recorded."""

from __future__ import annotations

from data_checks.errors import DataError

PAD_TOKEN = "<|pad|>"


def ensure_special_tokens(tokenizer) -> dict:
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
