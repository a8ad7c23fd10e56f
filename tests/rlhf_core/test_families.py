"""Every model family of tests/families.py through the rollout's sampler and LoRA: the lean
sampling loop is Hugging Face ``generate`` token for token (a chat family with its whole stop
set), and ``all-linear`` LoRA adapters land on each family's attention and MLP projections,
never on its LM head."""

import pytest
import torch

from data_checks.validate import ensure_special_tokens
from rlhf_core.models.data import encode, left_pad
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer
from rlhf_core.models.models import resize_for_tokenizer
from rlhf_core.models.sampling import cache_keyword, fits_lean_loop, multinomial, sample_responses
from rlhf_core.ppo.ppo_math import truncate_after_eos
from rlhf_core.ppo.rollout import sampling_config
from tests.families import FAMILIES

PROMPTS = ["tell me about cats", "hello", "please tell me about the rain and sun", "why"]


def _loaded(family_dir, name):
    tok = load_tokenizer(str(family_dir(name)))
    ensure_special_tokens(tok)  # as the data gate does: a PAD distinct from EOS
    model = load_pretrained(family_dir(name), LoadSpec()).eval()
    stops = model.generation_config.eos_token_id
    resize_for_tokenizer(model, tok)
    return tok, model, stops


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_lean_sampler_is_generate_for_every_family(family_dir, name):
    tok, policy, hub_stops = _loaded(family_dir, name)
    assert fits_lean_loop(policy)
    assert cache_keyword(policy) == "cache"  # the non-deprecated name of this transformers
    stops = sorted({tok.eos_token_id, *(hub_stops if isinstance(hub_stops, list) else [])})
    prompts = left_pad([encode(tok, p) for p in PROMPTS], tok.pad_token_id)
    gen = sampling_config(tok, 1.0, 12)
    gen.eos_token_id = stops
    with torch.no_grad():  # favour the stop tokens so rows end at different steps
        policy.get_output_embeddings().weight[stops] *= 40
    torch.manual_seed(5)
    out = policy.generate(input_ids=prompts, attention_mask=prompts != tok.pad_token_id,
                          generation_config=gen)
    torch.manual_seed(5)
    responses, logits = sample_responses(policy, prompts, tok.pad_token_id, stops, 1.0, 12,
                                         sampler=multinomial)
    want = out.sequences[:, prompts.shape[1]:]
    torch.testing.assert_close(responses, want[:, : responses.shape[1]], rtol=0, atol=0)
    assert (want[:, responses.shape[1]:] == tok.pad_token_id).all()
    torch.testing.assert_close(logits, torch.stack(out.logits, 1)[:, : logits.shape[1]],
                               rtol=0, atol=0)
    _, mask, has_eos = truncate_after_eos(responses, stops, tok.pad_token_id)
    assert has_eos.any()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_lora_adapters_land_on_each_familys_linear_layers(family_dir, name):
    pytest.importorskip("peft")
    from transformers.pytorch_utils import Conv1D  # GPT-2's projections

    from rlhf_core.config import LoraSettings
    from rlhf_core.models.loader import add_lora

    model = load_pretrained(family_dir(name), LoadSpec())
    n_linear = sum(isinstance(m, torch.nn.Linear | Conv1D) for n, m in model.named_modules()
                   if not n.endswith(("lm_head", "embed_out")))
    wrapped = add_lora(model, LoraSettings(r=2, alpha=4))
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in wrapped.named_parameters()
               if ".lora_A" in n}
    assert len(adapted) == n_linear >= 4  # every projection of the 1-layer block
    assert not any(a.endswith(("lm_head", "embed_out")) for a in adapted)
    trainable = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
