"""Token-level data: prompt and response tokenised apart (an exact boundary), EOS appended to
every response, padding (PAD must differ from EOS: padding is masked out) and batching.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import torch

IGNORE_INDEX = -100


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without any special token added."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def sft_example(prompt: list[int], response: list[int], eos_id: int,
                loss_on: str = "response") -> tuple[list[int], list[int]]:
    """Ids -> (input_ids, labels): prompt + response + EOS; prompt labels ignored unless 'all'."""
    r = response + [eos_id]
    labels = (prompt if loss_on == "all" else [IGNORE_INDEX] * len(prompt)) + r
    return prompt + r, labels


def pair_example(prompt: list[int], chosen: list[int], rejected: list[int],
                 eos_id: int) -> tuple[list[int], list[int]]:
    """Ids -> (chosen_ids, rejected_ids), each prompt + completion + EOS."""
    return prompt + chosen + [eos_id], prompt + rejected + [eos_id]


def right_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """List of id lists -> [B, max_len] long, padded on the right."""
    if not seqs:
        raise ValueError("right_pad: empty batch")
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """List of id lists -> [B, max_len] long, padded on the left (for generation)."""
    if not seqs:
        raise ValueError("left_pad: empty batch")
    return right_pad([list(s)[::-1] for s in seqs], pad_id).flip(1)


def last_real_index(input_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """[B, T] right-padded ids -> [B] index of the last non-pad token (the appended EOS)."""
    lengths = (input_ids != pad_id).long().sum(dim=1)
    if (lengths == 0).any():
        raise ValueError("last_real_index: a sequence is all padding")
    return lengths - 1


class ShuffledBatches:
    """Endless index batches over range(n), reshuffled every pass: ``next()`` stops at a pass's
    end, ``take(count)`` runs on into the next. Its saved position is the generator state
    that drew the pass (not the permutation), so a resumed run sees the same batches."""

    def __init__(self, n: int, batch_size: int, generator: torch.Generator):
        if n < 1:
            raise ValueError("ShuffledBatches: no examples")
        self.n, self.batch_size, self.generator = n, batch_size, generator
        self.order, self.cursor = torch.empty(0, dtype=torch.long), 0
        self.passes, self.pass_state = 0, None  # passes drawn; the generator's state before

    def next(self) -> torch.Tensor:
        return self._draw(self.batch_size)

    def take(self, count: int) -> torch.Tensor:
        """Exactly ``count`` indices: the rest of this pass, then the next reshuffled one."""
        parts = []
        while count > 0:
            parts.append(self._draw(count))
            count -= len(parts[-1])
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)

    def _draw(self, most: int) -> torch.Tensor:
        if self.cursor >= len(self.order):
            self.pass_state = self.generator.get_state()
            self.order, self.cursor = torch.randperm(self.n, generator=self.generator), 0
            self.passes += 1
        batch = self.order[self.cursor: self.cursor + most]
        self.cursor += len(batch)
        return batch

    def state_dict(self) -> dict:
        """JSON-ready: n, pass number, the generator state that drew the pass, cursor."""
        state = None if self.pass_state is None else \
            base64.b64encode(self.pass_state.numpy().tobytes()).decode("ascii")
        return {"n": self.n, "passes": self.passes, "pass_state": state, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        """Also reads a state holding the whole ``order``."""
        self.cursor = int(state["cursor"])
        if "order" in state:
            self.order = torch.tensor(state["order"], dtype=torch.long)
            return
        if int(state["n"]) != self.n:
            raise ValueError(f"ShuffledBatches: the saved data order covers {state['n']} "
                             f"examples, this data has {self.n} (did the data change?)")
        self.passes, self.pass_state = int(state["passes"]), None
        self.order = torch.empty(0, dtype=torch.long)
        if state["pass_state"] is not None:
            raw = base64.b64decode(state["pass_state"])
            self.pass_state = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
            replay = torch.Generator(device=self.generator.device)
            replay.set_state(self.pass_state)
            self.order = torch.randperm(self.n, generator=replay)
