"""What the served models do with a request: completion only, params honoured, conversations
rendered with the chat template and ended at its end-of-turn token, clear errors."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf_core.eval.serving import (
    GenerationSettings,
    RequestError,
    answer_rows,
    end_of_turn_id,
    load_served,
    reward_ids,
    score_rows,
    stop_ids,
)
from rlhf_core.models.loader import LoadSpec, load_pretrained
from rlhf_core.models.scoring import score_texts
from tests.tiny_chat import build_chat_model

CHAT = [{"role": "system", "content": "be nice"},
        {"role": "user", "content": "tell me about cats"}]
GREEDY = GenerationSettings(max_new_tokens=6, do_sample=False)


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    out = build_chat_model(tmp_path_factory.mktemp("chat"))
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    return model, tok, stop_ids(model, tok)


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return model, tok, stop_ids(model, tok)


def greedy_reference(model, tok, text: str, n: int, stop: list[int]) -> list[int]:
    """HF generate on the prompt alone: its new tokens, cut before the first stop token."""
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         do_sample=False, eos_token_id=stop, pad_token_id=tok.pad_token_id)
    new = out[0, ids.shape[1]:].tolist()
    return new[: next((i for i, t in enumerate(new) if t in stop), len(new))]


def test_stop_set_is_eos_generation_config_and_end_of_turn(chat, plain):
    model, tok, stop = chat
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn_id(tok) == im_end != tok.eos_token_id
    assert sorted(stop) == sorted([tok.eos_token_id, im_end])
    model.generation_config.eos_token_id = [tok.eos_token_id, 7]
    try:
        assert sorted(stop_ids(model, tok)) == sorted([tok.eos_token_id, 7, im_end])
    finally:
        model.generation_config.eos_token_id = tok.eos_token_id
    _, plain_tok, plain_stop = plain
    assert end_of_turn_id(plain_tok) is None and plain_stop == [plain_tok.eos_token_id]


def test_text_prompt_gets_its_greedy_completion_only(chat):
    model, tok, stop = chat
    prompts = ["hello world , tell me", "the rain"]
    answers = answer_rows(model, tok, prompts, GREEDY, stop)
    for prompt, answer in zip(prompts, answers):
        assert answer == tok.decode(greedy_reference(model, tok, prompt, 6, stop))
        assert answer and not answer.startswith(prompt)


def test_conversation_is_rendered_and_answered_as_an_assistant_message(chat):
    model, tok, stop = chat
    [answer] = answer_rows(model, tok, [CHAT], GREEDY, stop)
    rendered = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert rendered.endswith("<|im_start|>assistant\n")
    expected = tok.decode(greedy_reference(model, tok, rendered, 6, stop))
    assert answer == {"role": "assistant", "content": expected}


def test_generation_stops_at_the_end_of_turn_token(chat):
    """The model is made to emit <|im_end|> from its fourth step: three tokens come back."""
    model, tok, stop = chat
    im_end, calls = end_of_turn_id(tok), []

    def force(module, args, kwargs, out):
        calls.append(1)
        if len(calls) > 3:
            out.logits[..., im_end] = 1e4
        return out

    hook = model.register_forward_hook(force, with_kwargs=True)
    try:
        [answer] = answer_rows(model, tok, [CHAT], GREEDY, stop)
    finally:
        hook.remove()
    assert len(calls) == 4  # prefill + 3 steps, then <|im_end|> ended it
    assert len(tok(answer["content"], add_special_tokens=False)["input_ids"]) <= 3
    assert "<|im_end|>" not in answer["content"]


def test_params_seed_max_new_tokens_and_greedy(chat):
    model, tok, stop = chat
    prompts = ["hello world", CHAT]

    def ask(**params):
        return answer_rows(model, tok, prompts, GenerationSettings(**params), stop)

    seeded = ask(max_new_tokens=12, temperature=1.0, seed=3)
    assert seeded == ask(max_new_tokens=12, temperature=1.0, seed=3)
    assert seeded != ask(max_new_tokens=12, temperature=1.0, seed=4)
    assert ask(max_new_tokens=12, do_sample=False, seed=1) == \
        ask(max_new_tokens=12, do_sample=False, seed=2)
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    ask(max_new_tokens=4, seed=9)
    assert torch.rand(1) == before  # the caller's RNG stream is untouched
    short, long = ask(max_new_tokens=2, do_sample=False), ask(max_new_tokens=12, do_sample=False)
    n = [len(tok(a if isinstance(a, str) else a["content"])["input_ids"]) for a in short + long]
    assert max(n[:2]) <= 2 < max(n[2:])


@pytest.mark.parametrize(("prompt", "settings", "message"), [
    ([{"role": "user", "content": "hi"}], GREEDY,
     "row 1: 'prompt' is a list of messages, but this model's tokenizer has no chat template"),
    ([{"role": "user"}], GREEDY, "row 1: 'prompt' must be text or a list of messages"),
    ("", GREEDY, "row 1: 'prompt' is empty"),
    ("hello", GenerationSettings(max_new_tokens=0), "max_new_tokens must be >= 1"),
    ("hello", GenerationSettings(max_new_tokens=4, temperature=0.0), "temperature must be > 0"),
    ("hello", GenerationSettings(max_new_tokens=4, top_p=1.5), "top_p must be in (0, 1]"),
    ("hello", GenerationSettings(max_new_tokens=70), "exceeds the model's 64 positions"),
])
def test_bad_requests_are_one_sentence(plain, prompt, settings, message):
    model, tok, stop = plain
    with pytest.raises(RequestError) as err:
        answer_rows(model, tok, ["hello world", prompt], settings, stop)
    assert message in str(err.value)


def test_a_conversation_the_template_refuses_is_one_sentence(chat):
    model, tok, stop = chat
    strict = ("{% for m in messages %}{% if m['role'] == 'system' %}"
              "{{ raise_exception('no system messages') }}{% endif %}"
              "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
              "{% endif %}")
    original, tok.chat_template = tok.chat_template, strict
    try:
        assert end_of_turn_id(tok) == tok.convert_tokens_to_ids("<|im_end|>")
        assert answer_rows(model, tok, [CHAT[1:]], GREEDY, stop)[0]["role"] == "assistant"
        with pytest.raises(RequestError) as err:
            answer_rows(model, tok, [CHAT[1:], CHAT], GREEDY, stop)
    finally:
        tok.chat_template = original
    assert str(err.value) == ("row 1: the chat template cannot render this conversation "
                              "(TemplateError: no system messages)")


def test_reward_sequences_end_at_the_replys_end_of_turn(chat, plain):
    _, tok, _ = chat
    reply = {"role": "assistant", "content": "cats are nice"}
    ids = reward_ids(tok, CHAT, reply, 0, None)
    assert ids[-1] == end_of_turn_id(tok)
    whole = tok.apply_chat_template(CHAT + [reply], tokenize=False)
    assert tok.decode(ids) == whole.rstrip("\n")
    assert reward_ids(tok, CHAT, "cats are nice", 0, None) == ids  # text reply, same
    _, ptok, _ = plain
    assert reward_ids(ptok, "hello", "world", 0, None) == \
        ptok("hello world", add_special_tokens=False)["input_ids"] + [ptok.eos_token_id]
    with pytest.raises(RequestError, match="row 2: 'prompt' is text, so 'response' must be"):
        reward_ids(ptok, "hello", reply, 2, None)


def test_text_rows_score_as_the_core_does(tiny_model_dir):
    torch.manual_seed(0)
    rm = load_pretrained(tiny_model_dir, LoadSpec(), "new_head").eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts, responses = ["hello world", "tell me about cats"], ["sure .", "cats are nice !"]
    expected = score_texts(rm, tok, prompts, responses, torch.device("cpu"))
    assert score_rows(rm, tok, prompts, responses, batch_size=1) == \
        pytest.approx(expected.tolist(), abs=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_served_models_run_on_the_gpu_like_on_the_cpu(chat, tmp_path):
    model, tok, stop = chat
    folder = tmp_path / "policy"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    gpu, gpu_tok = load_served("policy", str(folder), str(folder), None)
    assert next(gpu.parameters()).device.type == "cuda"
    prompts = ["hello world", CHAT]
    assert answer_rows(gpu, gpu_tok, prompts, GREEDY, stop) == \
        answer_rows(model, tok, prompts, GREEDY, stop)
    seeded = GenerationSettings(max_new_tokens=8, seed=3)
    assert answer_rows(gpu, gpu_tok, prompts, seeded, stop) == \
        answer_rows(gpu, gpu_tok, prompts, seeded, stop)
    torch.manual_seed(0)
    load_pretrained(folder, LoadSpec(), "new_head").save(tmp_path / "rm")
    rm, _ = load_served("reward", str(tmp_path / "rm"), str(folder), None)
    reply = {"role": "assistant", "content": "cats are nice"}
    on_gpu = score_rows(rm, tok, [CHAT, "hello"], [reply, "world"])
    on_cpu = score_rows(rm.cpu(), tok, [CHAT, "hello"], [reply, "world"])
    # float32 matmuls run as TF32 on CUDA (rlhf_core/models/precision.py): 10 mantissa bits,
    # so scores agree to about 1e-3 relative (seen: 1.8e-4 on an H100)
    assert on_gpu == pytest.approx(on_cpu, rel=2e-3, abs=1e-3)
