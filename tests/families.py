"""Tiny random models of real model families, each with its family's tokenizer conventions.

Every family gets a byte-level BPE tokenizer trained here on a few sentences (a vocabulary of
a few hundred tokens, in milliseconds) carrying the family's special tokens the way its hub
tokenizer does: whether BOS is prepended, which token ends a sequence and a turn, whether a PAD
exists; the chat families carry their real chat template (Jinja) and a generation config whose
``eos_token_id`` lists the stop tokens, as the hub's instruct models do. The models come from
transformers' config classes at a few thousand parameters. Nothing is downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# Meta-Llama-3-8B-Instruct's template
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")
# Qwen2.5-Instruct's template without its tool-calling branches
CHATML_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{%- endif %}{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")
# Mistral-7B-Instruct-v0.1's template: no generation prompt, the turn ends with EOS
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...')"
    " }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}")

CORPUS = ("hello world tell me about cats dogs rain sun please thanks sure the weather is "
          "nice good bad tea oceans are calm assistant user system you are a helpful "
          "what why how can i help today").split()


@dataclass(frozen=True)
class Family:
    name: str
    config: str  # transformers config class
    specials: dict[str, str]  # bos/eos/pad/unk -> token text (absent: the family has none)
    add_bos: bool  # the tokenizer prepends BOS
    extra: tuple[str, ...] = ()  # further special tokens (turn markers)
    template: str | None = None
    stop: tuple[str, ...] = ()  # generation_config.eos_token_id, as on the hub
    model_kwargs: dict = field(default_factory=dict)

    @property
    def chat(self) -> bool:
        return self.template is not None


FAMILIES = {f.name: f for f in [
    Family("llama3", "LlamaConfig",
           {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>"}, add_bos=True,
           extra=("<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>"),
           template=LLAMA3_TEMPLATE, stop=("<|end_of_text|>", "<|eot_id|>"),
           model_kwargs={"num_key_value_heads": 1}),
    Family("qwen2", "Qwen2Config", {"eos": "<|im_end|>", "pad": "<|endoftext|>"},
           add_bos=False, extra=("<|im_start|>",), template=CHATML_TEMPLATE,
           stop=("<|im_end|>", "<|endoftext|>"), model_kwargs={"num_key_value_heads": 1}),
    Family("mistral", "MistralConfig", {"bos": "<s>", "eos": "</s>", "unk": "<unk>"},
           add_bos=True, template=MISTRAL_TEMPLATE, stop=("</s>",),
           model_kwargs={"num_key_value_heads": 1, "sliding_window": 16}),
    Family("gpt_neox", "GPTNeoXConfig", {"bos": "<|endoftext|>", "eos": "<|endoftext|>",
                                         "unk": "<|endoftext|>"}, add_bos=False),
    Family("gpt2", "GPT2Config", {"bos": "<|endoftext|>", "eos": "<|endoftext|>",
                                  "unk": "<|endoftext|>"}, add_bos=False),
    Family("opt", "OPTConfig", {"bos": "</s>", "eos": "</s>", "pad": "<pad>", "unk": "<unk>"},
           add_bos=True),
]}
CHAT_FAMILIES = [name for name, f in FAMILIES.items() if f.chat]


def build_tokenizer(family: Family):
    """A byte-level BPE tokenizer with the family's special tokens and conventions."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys([*family.specials.values(), *family.extra]))
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator([" ".join(CORPUS)] * 4, trainer=trainer)
    if family.add_bos:
        bos = family.specials["bos"]
        core.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, core.token_to_id(bos))])
    else:
        core.post_processor = processors.ByteLevel(trim_offsets=False)
    kwargs = {f"{k}_token": v for k, v in family.specials.items()}
    tok = PreTrainedTokenizerFast(tokenizer_object=core, chat_template=family.template,
                                  **kwargs)
    if family.extra:
        tok.add_special_tokens({"additional_special_tokens": list(family.extra)})
    return tok


def build_model(family: Family, tokenizer, seed: int = 0, extra_sizes: dict | None = None):
    """A random init of the family's architecture (a few thousand parameters, or the sizes
    in ``extra_sizes``: the config's size fields, e.g. hidden_size and num_hidden_layers)."""
    import torch
    import transformers

    ids = {f"{k}_token_id": tokenizer.convert_tokens_to_ids(v)
           for k, v in family.specials.items() if k != "unk"}
    sizes = {"GPT2Config": dict(n_embd=32, n_layer=1, n_head=2, n_positions=128),
             "OPTConfig": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               ffn_dim=64, word_embed_proj_dim=32, max_position_embeddings=128),
             }.get(family.config, dict(hidden_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=64,
                                       max_position_embeddings=128))
    kwargs = {**sizes, **ids, **family.model_kwargs, **(extra_sizes or {})}
    config = getattr(transformers, family.config)(vocab_size=len(tokenizer), **kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    if family.stop:
        model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(t)
                                                for t in family.stop]
    return model


def save_family(name: str, root: Path, extra_sizes: dict | None = None) -> Path:
    """Build family ``name`` and save model + tokenizer in ``root/name`` (loads with Auto*);
    ``extra_sizes``: see :func:`build_model`."""
    family = FAMILIES[name]
    out = Path(root) / name
    tokenizer = build_tokenizer(family)
    build_model(family, tokenizer, extra_sizes=extra_sizes).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


TOPICS = ["cats", "dogs", "rain", "sun", "tea", "oceans", "weather", "the sun"]


def chat_turns(i: int, last: str) -> list[dict]:
    """Conversation ``i``: a system turn on odd i, a hello/hi exchange on every third, a
    question about a topic, and the assistant's ``last`` answer (none when empty)."""
    topic = TOPICS[i % len(TOPICS)]
    head = [{"role": "system", "content": "you are a helpful assistant"}] if i % 2 else []
    if i % 3 == 0:  # a multi-turn prompt
        head += [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    return head + [{"role": "user", "content": f"tell me about {topic} {i}"}] + \
        ([{"role": "assistant", "content": last}] if last else [])


def write_chat_data(tmp: Path, n: int = 64) -> dict[str, str]:
    """Conversational data in TRL's formats under ``tmp``: ``n`` SFT conversations
    (messages), ``n`` implicit-prompt pairs with UltraFeedback-style scores, 32 prompts and
    16 held-out prompts (prompt messages) -> {source: path}."""
    good, bad = "sure , nice", "bad bad what why how"
    sft = [{"messages": chat_turns(i, good)} for i in range(n)]
    pref = [{"prompt": chat_turns(i, "")[-1]["content"], "chosen": chat_turns(i, good),
             "rejected": chat_turns(i, bad), "score_chosen": 8.0, "score_rejected": 2.0}
            for i in range(n)]
    prompts = [{"prompt": chat_turns(i, "")} for i in range(n, n + 32)]
    held_out = [{"prompt": chat_turns(i, "")} for i in range(n + 32, n + 48)]
    out = {}
    for name, rows in (("sft", sft), ("preference", pref), ("prompts", prompts),
                       ("eval_prompts", held_out)):
        path = Path(tmp) / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out[name] = str(path)
    return out
