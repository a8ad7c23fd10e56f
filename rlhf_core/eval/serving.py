"""What the registered models (the MLflow pyfuncs in ``tasks/``) do with a request: its prompt is
text or a conversation for the chat template; one they cannot answer raises :class:`RequestError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import GenerationConfig

from rlhf_core.models.chat import ChatError, end_of_turn_id, render, stop_token_ids
from rlhf_core.models.data import encode, left_pad
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer
from rlhf_core.models.models import ScalarHeadModel
from rlhf_core.models.scoring import score_ids


class RequestError(ValueError):
    """A request the served model cannot answer; the message names the row and field."""


@dataclass(frozen=True)
class GenerationSettings:
    """A request's sampling settings (the served policy's MLflow ``params``)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    do_sample: bool = True
    seed: int | None = None

    def check(self) -> None:
        if self.max_new_tokens < 1:
            raise RequestError(f"params: max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.do_sample and not self.temperature > 0:
            raise RequestError(f"params: temperature must be > 0 when sampling, got "
                               f"{self.temperature} (send do_sample: false for greedy)")
        if not 0 < self.top_p <= 1:
            raise RequestError(f"params: top_p must be in (0, 1], got {self.top_p}")

    def generation_config(self, stop: list[int], pad_id: int) -> GenerationConfig:
        """A fresh config: nothing comes from the saved model's own sampling defaults."""
        sampling = {"temperature": self.temperature, "top_p": self.top_p, "top_k": 0} \
            if self.do_sample else {}
        never = {"suppress_tokens": [pad_id]} if pad_id not in stop else {}  # as in training
        return GenerationConfig(max_new_tokens=self.max_new_tokens, do_sample=self.do_sample,
                                eos_token_id=stop, pad_token_id=pad_id, bos_token_id=None,
                                **sampling, **never)


def load_served(kind: str, model_dir: str, tokenizer_dir: str, model_config: dict | None):
    """``kind`` policy or reward -> (model, tokenizer): float32, frozen, on a GPU if any."""
    trust = bool((model_config or {}).get("trust_remote_code", False))
    spec = LoadSpec(trust_remote_code=trust)
    model = load_pretrained(model_dir, spec, {"policy": "policy", "reward": "scalar"}[kind],
                            trainable=False)
    if torch.cuda.is_available():
        model = model.to("cuda")
    return model, load_tokenizer(tokenizer_dir, spec)


def as_messages(value, row: int, field: str) -> list[dict] | None:
    """A conversation (list of {role, content}) -> its messages; plain text -> None."""
    if isinstance(value, str):
        return None
    if isinstance(value, dict):
        value = [value]
    if hasattr(value, "tolist"):  # a column of lists may arrive as numpy arrays
        value = value.tolist()
    ok = isinstance(value, list) and value and all(
        isinstance(m, dict) and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str) for m in value)
    if not ok:
        raise RequestError(f"row {row}: '{field}' must be text or a list of messages "
                           f"{{role, content}}, got {str(value)[:80]!r}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _rendered_ids(tokenizer, messages: list[dict], row: int, generation_prompt: bool):
    """A request row's conversation -> token ids, or a RequestError naming the row."""
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError(f"row {row}: 'prompt' is a list of messages, but this model's "
                           "tokenizer has no chat template; send it as plain text")
    try:
        text = render(tokenizer, messages, generation_prompt)
    except ChatError as err:  # the template's own complaint, said per row
        raise RequestError(f"row {row}: {err}") from None
    return encode(tokenizer, text)


def stop_ids(model, tokenizer) -> list[int]:
    """Tokens that end an answer, as a list (``stop_token_ids``)."""
    stops = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    return stops if isinstance(stops, list) else [stops]


def prompt_ids(tokenizer, prompt, row: int) -> tuple[list[int], bool]:
    """A request's prompt -> (token ids, whether it is a conversation)."""
    messages = as_messages(prompt, row, "prompt")
    if messages is not None:
        ids = _rendered_ids(tokenizer, messages, row, generation_prompt=True)
    else:
        ids = encode(tokenizer, prompt)
    if not ids:
        raise RequestError(f"row {row}: 'prompt' is empty")
    return ids, messages is not None


@torch.inference_mode()
def generate_completions(model, ids: list[list[int]], settings: GenerationSettings,
                         stop: list[int], pad_id: int) -> list[list[int]]:
    """Each prompt's ids -> its completion's ids, cut before the first stop token; a ``seed``
    leaves the caller's RNG stream untouched."""
    settings.check()
    limit, budget = getattr(model.config, "max_position_embeddings", None), settings.max_new_tokens
    for row, seq in enumerate(ids):
        if limit and len(seq) + budget > limit:
            raise RequestError(f"row {row}: a prompt of {len(seq)} tokens + max_new_tokens "
                               f"{budget} exceeds the model's {limit} positions")
    device = next(model.parameters()).device
    prompts = left_pad(ids, pad_id).to(device)  # (B, P)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if settings.seed is not None:
            torch.manual_seed(settings.seed)
        out = model.generate(input_ids=prompts, attention_mask=prompts != pad_id,
                             generation_config=settings.generation_config(stop, pad_id))
    completions = []
    for seq in out[:, prompts.shape[1]:].tolist():  # (B, R)
        end = next((t for t, tok in enumerate(seq) if tok in stop or tok == pad_id), len(seq))
        completions.append(seq[:end])
    return completions


def answer_rows(model, tokenizer, prompts: Sequence, settings: GenerationSettings,
                stop: list[int]) -> list:
    """The served policy's predict: each prompt -> its completion (a message for a chat)."""
    if not len(prompts):
        return []
    encoded = [prompt_ids(tokenizer, p, row) for row, p in enumerate(prompts)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
        else tokenizer.eos_token_id
    completions = generate_completions(model, [ids for ids, _ in encoded], settings, stop, pad_id)
    answers = []
    for (_, chat), completion in zip(encoded, completions):
        text = tokenizer.decode(completion, skip_special_tokens=True)
        answers.append({"role": "assistant", "content": text} if chat else text)
    return answers


def reward_ids(tokenizer, prompt, response, row: int, end_of_turn: int | None) -> list[int]:
    """One (prompt, response) row -> the ids the reward model scores at the last token (text +
    EOS, or the conversation cut after the reply's end-of-turn)."""
    messages = as_messages(prompt, row, "prompt")
    if messages is None:
        if not isinstance(response, str):
            raise RequestError(f"row {row}: 'prompt' is text, so 'response' must be text too")
        return encode(tokenizer, prompt) + encode(tokenizer, response) + [tokenizer.eos_token_id]
    # the reply: text, one assistant message or a list of them
    reply = [{"role": "assistant", "content": response}] if isinstance(response, str) \
        else as_messages(response, row, "response")
    ids = _rendered_ids(tokenizer, messages + reply, row, generation_prompt=False)
    end = end_of_turn_id(tokenizer) if end_of_turn is None else end_of_turn
    end = tokenizer.eos_token_id if end is None else end
    if end not in ids:
        raise RequestError(f"row {row}: the rendered conversation has no end-of-turn token "
                           f"({tokenizer.convert_ids_to_tokens(end)}) to score at")
    return ids[: len(ids) - ids[::-1].index(end)]


def score_rows(model: ScalarHeadModel, tokenizer, prompts: Sequence, responses: Sequence,
               batch_size: int = 64) -> list[float]:
    """The served reward model's predict: the score of each (prompt, response) row."""
    end_of_turn = end_of_turn_id(tokenizer)
    seqs = [reward_ids(tokenizer, p, r, row, end_of_turn)
            for row, (p, r) in enumerate(zip(prompts, responses))]
    return score_ids(model, seqs, tokenizer.pad_token_id, next(model.parameters()).device,
                     batch_size).tolist()
