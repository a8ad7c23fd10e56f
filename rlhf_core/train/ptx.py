"""The pretraining mix, PPO-ptx (README § Sources [InstructGPT]): the training objective plus
``ptx_coef`` times the language-model loss on raw text, to pay less alignment tax. It draws
from a stream of its own, so a run without the mix stays bit-identical.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import torch

from rlhf_core.models.data import ShuffledBatches, right_pad


def chunk_ids(token_rows: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    """Each text's ids cut into chunks of at most ``max_tokens`` (one-token chunks dropped)."""
    if max_tokens < 2:
        raise ValueError("chunk_ids: max_tokens must be at least 2")
    out = []
    for ids in token_rows:
        out += [list(ids[i: i + max_tokens]) for i in range(0, len(ids), max_tokens)
                if len(ids[i: i + max_tokens]) >= 2]
    return out


def lm_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean -log p(token | tokens before) over the real tokens that have a predecessor: logits
    [B, T, V], right-padded ids [B, T], mask [B, T] True at real tokens -> the scalar loss (an
    error when no row has two real tokens)."""
    target = mask[:, 1:]  # [B, T-1] a real token predicted from the ones before it
    n = target.sum()
    if int(n) == 0:
        raise ValueError("lm_loss: no token to predict (every row is shorter than 2 tokens)")
    return -(next_token_logp(logits, ids) * target).sum() / n


def next_token_logp(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V], ids [B, T] -> [B, T-1] float32 log p(token | tokens before)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [B, T-1, V]
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)


def padded_lm_forward(model, rows: Sequence[Sequence[int]], pad_id: int, device):
    """``rows`` right-padded through the LM -> (logits [B, T, V], ids [B, T], mask [B, T])."""
    ids = right_pad(rows, pad_id).to(device)
    mask = torch.zeros_like(ids, dtype=torch.bool)  # True at real tokens
    for i, row in enumerate(rows):
        mask[i, : len(row)] = True
    return model(input_ids=ids, attention_mask=mask.long()).logits, ids, mask


PTX_SEED_OFFSET = 7919  # the pretraining stream's seed: the stage's, offset


class PretrainMix:
    """The pretraining text's stream: ``loss(model)`` is :func:`lm_loss` on the next chunks,
    drawn by a generator of its own so the stage's data order is unchanged."""

    def __init__(self, chunks: Sequence[Sequence[int]], batch_size: int, pad_id: int,
                 generator: torch.Generator, device: torch.device | str = "cpu"):
        if not chunks:
            raise ValueError("ptx_coef > 0 needs pretraining text (data.pretrain)")
        self.chunks, self.batch_size, self.pad_id = chunks, batch_size, pad_id
        self.device = torch.device(device)
        own = torch.Generator().manual_seed(generator.initial_seed() + PTX_SEED_OFFSET)
        self.stream = ShuffledBatches(len(chunks), batch_size, own)

    def loss(self, model) -> torch.Tensor:
        rows = [self.chunks[i] for i in self.stream.take(self.batch_size).tolist()]
        return lm_loss(*padded_lm_forward(model, rows, self.pad_id, self.device))

    def state_dict(self) -> dict:
        """The stream's position and its generator's state (the next pass's order)."""
        gen = base64.b64encode(self.stream.generator.get_state().numpy().tobytes())
        return {**self.stream.state_dict(), "generator": gen.decode("ascii")}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state)
        raw = bytearray(base64.b64decode(state["generator"]))
        self.stream.generator.set_state(torch.frombuffer(raw, dtype=torch.uint8))
