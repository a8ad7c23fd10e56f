"""rlhf_core/models/chat.py, the one renderer: prompts with the generation prompt (text or ids, one
BOS), replies cut at the end-of-turn token, the stop set, and what SFT and the reward model see
of a rendered row (loss on the reply and its end-of-turn; the score read at the end-of-turn)."""

import pytest
import torch

from data_checks.validate import ensure_special_tokens
from rlhf_core.models.chat import (
    ChatError,
    end_of_turn,
    prepare_chat,
    render_prompt,
    render_reply,
    stop_token_ids,
)
from rlhf_core.models.data import (
    IGNORE_INDEX,
    encode,
    last_real_index,
    right_pad,
)
from tests.conftest import encode_pair, encode_sft
from tests.families import FAMILIES, build_tokenizer

CONV = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"}, {"role": "user", "content": "why rain"}]


def chat_tokenizer(name):
    tok = build_tokenizer(FAMILIES[name])
    ensure_special_tokens(tok)
    prepare_chat(tok)
    return tok


@pytest.mark.parametrize("name,eot", [("llama3", "<|eot_id|>"), ("qwen2", "<|im_end|>"),
                                      ("mistral", "</s>")])
def test_end_of_turn_of_each_chat_family(name, eot):
    assert end_of_turn(build_tokenizer(FAMILIES[name])) == eot


def test_render_prompt_gives_text_or_ids_with_one_bos():
    tok = chat_tokenizer("llama3")
    text = render_prompt(tok, CONV)
    assert text.startswith("<|begin_of_text|>") and text.count("<|begin_of_text|>") == 1
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = render_prompt(tok, CONV, tokenize=True)
    assert ids == encode(tok, text) and ids.count(tok.bos_token_id) == 1
    # the tokenizer's own BOS would double it: the renderer never adds special tokens
    assert tok(text)["input_ids"].count(tok.bos_token_id) == 2


def test_sft_learns_the_reply_and_its_end_of_turn_and_the_rm_reads_there():
    tok = chat_tokenizer("qwen2")
    prompt = render_prompt(tok, CONV)
    reply = render_reply(tok, CONV, "rain is good")
    assert reply == "rain is good"
    ids, labels = encode_sft(tok, prompt, reply)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    learned = [t for t, lab in zip(ids, labels) if lab != IGNORE_INDEX]
    assert learned == encode(tok, reply) + [eot]
    assert tok.decode(ids) == tok.apply_chat_template(
        [*CONV, {"role": "assistant", "content": "rain is good"}], tokenize=False).rstrip("\n")
    chosen, rejected = encode_pair(tok, prompt, reply, "bad")
    batch = right_pad([chosen, rejected], tok.pad_token_id)
    at = last_real_index(batch, tok.pad_token_id)
    assert batch[torch.arange(2), at].tolist() == [eot, eot]


def test_the_stop_set():
    llama = chat_tokenizer("llama3")
    gen = type("Gen", (), {"eos_token_id": [llama.convert_tokens_to_ids("<|end_of_text|>")]})
    assert sorted(stop_token_ids(llama, gen)) == sorted(
        llama.convert_tokens_to_ids(["<|eot_id|>", "<|end_of_text|>"]))
    plain = build_tokenizer(FAMILIES["gpt2"])  # no template: EOS alone, as one id
    assert stop_token_ids(plain) == plain.eos_token_id


def test_a_reply_the_template_does_not_end_is_refused():
    tok = build_tokenizer(FAMILIES["qwen2"])
    with pytest.raises(ChatError, match="writes no '<|eot_id|>' after this reply"):
        render_reply(tok, CONV, "sure", eot="<|eot_id|>")


def test_resize_for_tokenizer_keeps_the_models_stop_tokens():
    from rlhf_core.models.models import resize_for_tokenizer
    from tests.families import build_model

    tok = chat_tokenizer("llama3")  # EOS <|eot_id|>, a PAD added
    model = build_model(FAMILIES["llama3"], build_tokenizer(FAMILIES["llama3"]))
    ids = tok.convert_tokens_to_ids(["<|end_of_text|>", "<|eot_id|>"])
    model.config.eos_token_id = ids  # a list, as Llama 3.1's config has
    model.generation_config.eos_token_id = ids[0]
    resize_for_tokenizer(model, tok)
    assert model.get_input_embeddings().num_embeddings == len(tok)
    assert sorted(model.generation_config.eos_token_id) == sorted(ids)
    assert model.config.eos_token_id == tok.eos_token_id == ids[1]


@pytest.mark.parametrize("name", ["llama3", "qwen2", "mistral"])
def test_many_conversations_render_as_each_alone(name):
    from rlhf_core.models import chat

    tok = chat_tokenizer(name)
    user = CONV[1:2]
    convs = [CONV[1:] if name == "mistral" else CONV, user,
             [{"role": "user", "content": "a \x00rlhf-end-of-conversation\x00 b"}],  # the marker
             [*user, {"role": "assistant", "content": " spaced  "}, *user]]
    for generation_prompt in (True, False):
        one_by_one = [chat.render(tok, c, generation_prompt) for c in convs]
        assert chat.render_many(tok, convs, generation_prompt) == one_by_one
        assert chat.render_many(tok, convs[:2] + convs[3:], generation_prompt) == \
            one_by_one[:2] + one_by_one[3:]
    calls = []
    real = chat.render
    chat.render = lambda *a: calls.append(a) or real(*a)
    try:  # the loop renders them; one by one only the first and last, to check it
        assert chat.render_many(tok, convs[:2] + convs[3:], True) == \
            [real(tok, c, True) for c in convs[:2] + convs[3:]]
    finally:
        chat.render = real
    assert len(calls) == 2
    assert chat.render_many(tok, [], True) == []
    if name == "mistral":  # a conversation the template refuses: the error is its own
        with pytest.raises(ChatError, match="Conversation roles must alternate"):
            chat.render_many(tok, [user, [*user, *user]], True)
