"""A tiny chat model built locally (no hub): a Qwen2-shaped causal LM with a byte-level BPE
tokenizer carrying ChatML's turn markers and template. EOS is ``<|endoftext|>`` (a base
model's), so ``<|im_end|>`` ends a turn only as the template's end-of-turn token."""

from __future__ import annotations

from pathlib import Path

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
          "'<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
TEXT = "hello world , tell me about cats and dogs ! please thanks sure the rain is nice ."


def chat_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator([TEXT] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>",
                                   pad_token="<|pad|>", chat_template=CHATML)


def build_chat_model(out: Path, seed: int = 0) -> Path:
    """Save the tiny chat model and its tokenizer in ``out`` -> ``out``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = chat_tokenizer()
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=128, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out
