"""Tokenizer checks: EOS must exist; PAD must exist and differ from EOS (an EOS masked as
padding is never learned), else a dedicated pad token is added and recorded."""

from __future__ import annotations

from data_checks.loading import DataError

PAD_TOKEN = "<|pad|>"


def ensure_special_tokens(tokenizer) -> dict:
    if tokenizer.eos_token_id is None:
        raise DataError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r}: no EOS token")
    added = tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id
    if added:
        tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    return {"pad_added": added, "pad_token": tokenizer.pad_token,
            "pad_token_id": tokenizer.pad_token_id, "eos_token": tokenizer.eos_token,
            "eos_token_id": tokenizer.eos_token_id}
