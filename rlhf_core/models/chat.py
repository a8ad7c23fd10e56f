"""Conversations through the tokenizer's chat template, the one place they are rendered: a row
becomes the prompt (with the assistant header) and the reply (up to the end-of-turn token),
which :func:`prepare_chat` makes the EOS, so every stage works as on plain text.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlhf_core.models.data import encode

_PROBE = "rlhfprobe"  # assistant content used to see what the template writes around a reply
_USER = [{"role": "user", "content": "hi"}]


class ChatError(ValueError):
    """A template or conversation the pipeline cannot use; the message says the fix."""


def render(tokenizer, messages: Sequence[dict], generation_prompt: bool) -> str:
    """Messages -> their text, with the generation prompt (the assistant header) or without."""
    try:
        fast = _compiled(tokenizer) if _plain(messages) else None
        if fast is not None:
            return fast.render(messages=list(messages), tools=None, documents=None,
                               add_generation_prompt=generation_prompt,
                               **tokenizer.special_tokens_map)
        return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                             add_generation_prompt=generation_prompt)
    except Exception as err:  # noqa: BLE001 - jinja raises many types (raise_exception too)
        raise ChatError(f"the chat template cannot render this conversation "
                        f"({type(err).__name__}: {err})") from None


def _plain(messages: Sequence[dict]) -> bool:
    """Messages of exactly a string role and a string content (what the data gate renders)."""
    return all(type(m) is dict and len(m) == 2 and type(m.get("role")) is str
               and type(m.get("content")) is str for m in messages)


_COMPILED: dict[tuple, object] = {}  # (template, special tokens) -> template, or None


def _compiled(tokenizer):
    """The chat template compiled once, to render plain messages without
    ``apply_chat_template``'s per-call conversions; None (use that) where a probe renders
    differently or transformers lacks the function."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return None
    key = (template, repr(tokenizer.special_tokens_map))
    if key not in _COMPILED:
        _COMPILED[key] = None
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            compiled = _compile_jinja_template(template)
            probe = [*_USER, {"role": "assistant", "content": _PROBE}]
            for gen in (True, False):
                fast = compiled.render(messages=probe, tools=None, documents=None,
                                       add_generation_prompt=gen,
                                       **tokenizer.special_tokens_map)
                if fast != tokenizer.apply_chat_template(probe, tokenize=False,
                                                         add_generation_prompt=gen):
                    return None
            _COMPILED[key] = compiled
        except Exception:  # noqa: BLE001 - a template or transformers version it does not fit
            return None
    return _COMPILED[key]


def render_prompt(tokenizer, messages: Sequence[dict], tokenize: bool = False):
    """Messages -> the prompt text with the generation prompt, or its ids (no special tokens
    added: the template writes its own BOS)."""
    text = render(tokenizer, messages, True)
    return encode(tokenizer, text) if tokenize else text


_SEP = "\x00rlhf-end-of-conversation\x00"


def render_many(tokenizer, conversations: Sequence[Sequence[dict]],
                generation_prompt: bool = True) -> list[str]:
    """[N] conversations -> [N] texts in one looped render (Jinja's per-render set-up dominates
    short ones); falls back to one by one if the first or last text differs or one fails."""
    looped = _looped(tokenizer) if conversations and all(_plain(c) for c in conversations) else None
    if looped is not None:
        try:
            parts = looped.render(rlhf_conversations=[list(c) for c in conversations],
                                  add_generation_prompt=generation_prompt, tools=None,
                                  documents=None, **tokenizer.special_tokens_map).split(_SEP)
            if len(parts) == len(conversations) + 1 and parts[-1] == "" and \
                    parts[0] == render(tokenizer, conversations[0], generation_prompt) and \
                    parts[-2] == render(tokenizer, conversations[-1], generation_prompt):
                return parts[:-1]
        except Exception:  # noqa: BLE001 - one by one below names the conversation
            pass
    return [render(tokenizer, c, generation_prompt) for c in conversations]


def _looped(tokenizer):
    """The template looped over ``rlhf_conversations``, each text followed by _SEP, or None."""
    if _compiled(tokenizer) is None:
        return None
    template = tokenizer.chat_template
    template = template[:-1] if template.endswith("\n") else template  # Jinja drops one
    key = ("looped", template)
    if key not in _COMPILED:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        _COMPILED[key] = _compile_jinja_template(
            "{% for messages in rlhf_conversations %}" + template + _SEP + "{% endfor %}")
    return _COMPILED[key]


def end_of_turn(tokenizer) -> str:
    """The special token that ends an assistant turn in the template; ChatError if there is
    none or no generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatError("the tokenizer has no chat template (set model.chat_template to a "
                        "Jinja string or a file holding one)")
    prompt = render(tokenizer, _USER, True)
    full = render(tokenizer, [*_USER, {"role": "assistant", "content": _PROBE}], False)
    if not full.startswith(prompt) or not full[len(prompt):].lstrip().startswith(_PROBE):
        header = full[len(prompt):full.find(_PROBE)] if full.startswith(prompt) else ""
        raise ChatError("the template has no generation prompt: with add_generation_prompt it "
                        f"does not end the prompt with the assistant header ({header!r} comes "
                        "between the prompt and the reply); set model.chat_template to one "
                        "with an add_generation_prompt branch")
    after = full[full.index(_PROBE) + len(_PROBE):]
    ids = encode(tokenizer, after)
    if ids and ids[0] in tokenizer.all_special_ids + list(tokenizer.added_tokens_decoder):
        return tokenizer.convert_ids_to_tokens(ids[0])
    marker = after.strip().split()[0] if after.strip() else ""
    if marker:
        raise ChatError(f"the template ends an assistant turn with {marker!r}, which is not one "
                        f"token of the tokenizer's vocabulary (add it as a special token, or "
                        f"use a tokenizer that has it)")
    raise ChatError("the template writes no end-of-turn token after an assistant message (set "
                    "model.chat_template to one that ends each turn with a special token)")


def end_of_turn_id(tokenizer) -> int | None:
    """The id of the template's end-of-turn token, or None (no template, or one unfit for
    conversations)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        return tokenizer.convert_tokens_to_ids(end_of_turn(tokenizer))
    except ChatError:
        return None


def render_reply(tokenizer, prompt: Sequence[dict], reply: str, prompt_text: str | None = None,
                 eot: str | None = None) -> str:
    """The template's text for ``reply`` after the prompt, up to its end-of-turn token."""
    prompt_text = render(tokenizer, prompt, True) if prompt_text is None else prompt_text
    full = render(tokenizer, [*prompt, {"role": "assistant", "content": reply}], False)
    return reply_text(tokenizer, full, prompt_text, eot)


def reply_text(tokenizer, full: str, prompt_text: str, eot: str | None = None) -> str:
    """What follows ``prompt_text`` in ``full`` up to the end-of-turn token ``eot``."""
    if not full.startswith(prompt_text):
        raise ChatError("the template renders the prompt differently once a reply follows it "
                        "(the prompt text is not a prefix of the whole conversation)")
    rest = full[len(prompt_text):]
    eot = eot or end_of_turn(tokenizer)
    if eot not in rest:
        raise ChatError(f"the template writes no {eot!r} after this reply")
    return rest[: rest.index(eot)]


def prepare_chat(tokenizer) -> dict:
    """Check the template and make the EOS its end-of-turn token -> what was done (run tags)."""
    eot = end_of_turn(tokenizer)
    eot_id = tokenizer.convert_tokens_to_ids(eot)
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id == eot_id and \
            tokenizer.pad_token_id != tokenizer.eos_token_id:
        raise ChatError(f"the end-of-turn token {eot!r} is also the tokenizer's PAD, so it "
                        "would be masked out and never learned (give the tokenizer another "
                        "pad_token, or none and the pipeline adds one)")
    before = tokenizer.eos_token
    if before != eot:
        tokenizer.eos_token = eot
    return {"end_of_turn": eot, "end_of_turn_id": eot_id, "eos_before": before}


_BOS_WRITTEN: dict[tuple, int] = {}  # (tokenizer, template, roles) -> BOS tokens written


def check_bos(tokenizer, prompt_text: str, messages: Sequence[dict]) -> None:
    """ChatError if a rendered prompt holds more BOS tokens than the template writes for
    ``messages``' roles: an extra one can only come from the data. A BOS that is also the EOS
    is not counted."""
    bos = tokenizer.bos_token_id
    if bos is None or bos == tokenizer.eos_token_id or \
            prompt_text.count(tokenizer.bos_token) <= 1:  # a special token: its text, once
        return
    count = encode(tokenizer, prompt_text).count(bos)
    roles = tuple(m["role"] for m in messages)
    key = (id(tokenizer), getattr(tokenizer, "chat_template", None), roles)
    if key not in _BOS_WRITTEN:  # how many BOS the template writes for these roles (>= 1)
        probe = render_prompt(tokenizer, [{"role": role, "content": _PROBE} for role in roles])
        _BOS_WRITTEN[key] = max(1, encode(tokenizer, probe).count(bos))
    allowed = _BOS_WRITTEN[key]
    if count > allowed:
        wrote = "one" if allowed == 1 else str(allowed)
        raise ChatError(f"the rendered prompt holds {count} BOS tokens "
                        f"({tokenizer.bos_token!r}): the template writes {wrote} and the row "
                        "holds another; remove it from the row's messages")


def stop_token_ids(tokenizer, generation_config=None) -> int | list[int]:
    """The ids that end a response (EOS, end-of-turn, the generation config's); one if equal."""
    stops = [tokenizer.eos_token_id, end_of_turn_id(tokenizer)]
    extra = getattr(generation_config, "eos_token_id", None)
    stops += extra if isinstance(extra, list) else [] if extra is None else [extra]
    stops = [s for s in dict.fromkeys(stops) if s is not None and s != tokenizer.pad_token_id]
    return stops[0] if len(stops) == 1 else stops
