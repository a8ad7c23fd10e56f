"""LoRA option: policy and critic are adapters over frozen trunks; the reference and the reward
model are those trunks with the adapters off, so an update moves neither of them."""

import pytest
import torch

from rlhf_core.config import LoraSettings, ModelConfig, OptimConfig, PPOConfig
from rlhf_core.models.adapters import save_policy_adapter, save_scalar_adapter
from rlhf_core.models.data import encode
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer, ppo_models
from rlhf_core.ppo.trainer import PPOTrainer

pytest.importorskip("peft")

PROMPTS = ["tell me about cats :", "hello :", "please tell me about the rain and sun :",
           "the dogs are nice :"]


def test_lora_ppo_trains_adapters_and_leaves_reference_and_reward_alone(tiny_model_dir,
                                                                        tmp_path):
    spec = LoadSpec.from_config(ModelConfig(lora=LoraSettings(r=4, alpha=8)), "cpu")
    torch.manual_seed(0)
    load_pretrained(tiny_model_dir, spec, "new_head").save(tmp_path / "rm")
    models = ppo_models(tiny_model_dir, tiny_model_dir, tmp_path / "rm", tmp_path / "rm", spec)
    policy, ref, value, reward = models
    tok = load_tokenizer(tiny_model_dir, spec)
    ids = torch.tensor([encode(tok, PROMPTS[2])])
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        ref_before, reward_before = ref(input_ids=ids).logits, reward(ids, mask)
        assert torch.equal(policy(input_ids=ids).logits, ref_before)  # LoRA B starts at 0
        assert torch.equal(value(ids, mask), reward_before)  # critic = RM at the start
    cfg = PPOConfig(iterations=2, rollout_batch_size=4, num_minibatches=1, ppo_epochs=2,
                    max_new_tokens=6, optim=OptimConfig(lr=1e-2))
    tr = PPOTrainer(models, tokenizer=tok,
                    prompt_ids=[encode(tok, p) for p in PROMPTS], cfg=cfg,
                    norm_stats={"mean": 0.0, "std": 1.0, "n": 1}, device=torch.device("cpu"),
                    generator=torch.Generator().manual_seed(0))
    trained = {n for n, p in list(policy.named_parameters()) + list(value.named_parameters())
               if p.requires_grad}
    assert trained and all("lora_" in n or n.startswith("head.") for n in trained)
    tr.step()
    with torch.no_grad():
        assert torch.equal(ref(input_ids=ids).logits, ref_before)
        assert torch.equal(reward(ids, mask), reward_before)
        assert not torch.equal(policy(input_ids=ids).logits, ref_before)
        after, value_after = policy(input_ids=ids).logits, value(ids, mask)
    # saved alone (adapters, the value head) over the folders they adapt; loaded back merged
    save_policy_adapter(policy, tok, tmp_path / "policy", tiny_model_dir,
                        policy.get_input_embeddings().num_embeddings)
    save_scalar_adapter(value, tmp_path / "value", tmp_path / "rm")
    full = LoadSpec()
    final_policy = load_pretrained(tmp_path / "policy", full, trainable=False)
    final_value = load_pretrained(tmp_path / "value", full, "scalar", trainable=False)
    with torch.no_grad():
        torch.testing.assert_close(final_policy(input_ids=ids).logits, after, atol=1e-5,
                                   rtol=1e-5)
        torch.testing.assert_close(final_value(ids, mask), value_after, atol=1e-5, rtol=1e-5)
    assert not hasattr(final_policy, "peft_config")
    weights = sorted(p.name for p in (tmp_path / "policy").glob("*.safetensors"))
    assert weights == ["adapter_model.safetensors"]  # no copy of the frozen base


def test_a_lora_critic_with_a_new_head_adapts_the_start_policys_trunk(tiny_model_dir,
                                                                       tmp_path):
    """``new_head`` (no reward model among the sources): the critic is an adapter and a new
    fp32 head over the start policy's trunk, the reward model a frozen model of its own that an
    update leaves alone; the critic saved over the policy's folder loads back as trained."""
    spec = LoadSpec.from_config(ModelConfig(lora=LoraSettings(r=4, alpha=8)), "cpu")
    torch.manual_seed(0)
    rm = load_pretrained(tiny_model_dir, spec, "new_head")
    with torch.no_grad():  # a trained reward model: its trunk is not the policy's
        for p in rm.backbone.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    rm.save(tmp_path / "rm")
    models = ppo_models(tiny_model_dir, tiny_model_dir, tiny_model_dir, tmp_path / "rm", spec,
                        new_head=True)
    value, reward = models.value_model, models.reward_model
    tok = load_tokenizer(tiny_model_dir, spec)
    ids = torch.tensor([encode(tok, PROMPTS[2])])
    mask = torch.ones_like(ids, dtype=torch.bool)
    start = load_pretrained(tiny_model_dir, LoadSpec(), "new_head")
    with torch.no_grad():
        torch.testing.assert_close(value.hidden(ids, mask), start.hidden(ids, mask))
        assert not torch.allclose(reward.hidden(ids, mask), start.hidden(ids, mask))
        reward_before = reward(ids, mask)
    assert not torch.equal(value.head.weight, reward.head.weight.float())  # a new head
    assert value.head.weight.dtype == torch.float32 and value.head.weight.requires_grad
    cfg = PPOConfig(iterations=1, rollout_batch_size=4, num_minibatches=1, ppo_epochs=2,
                    max_new_tokens=6, optim=OptimConfig(lr=1e-2))
    tr = PPOTrainer(models, tokenizer=tok, prompt_ids=[encode(tok, p) for p in PROMPTS],
                    cfg=cfg, norm_stats={"mean": 0.0, "std": 1.0, "n": 1},
                    device=torch.device("cpu"), generator=torch.Generator().manual_seed(0))
    trained = {n for n, p in value.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n or n.startswith("head.") for n in trained)
    tr.step()
    with torch.no_grad():
        assert torch.equal(reward(ids, mask), reward_before)
        value_after = value(ids, mask)
    save_scalar_adapter(value, tmp_path / "value", tiny_model_dir)
    final = load_pretrained(tmp_path / "value", LoadSpec(), "scalar", trainable=False)
    with torch.no_grad():
        torch.testing.assert_close(final(ids, mask), value_after, atol=1e-5, rtol=1e-5)


def test_a_healthy_snapshot_of_lora_holds_the_adapters_and_restores_them(tiny_model_dir,
                                                                          tmp_path):
    """With LoRA a snapshot keeps the trained weights only (adapters, the value head), and a
    stop puts them back: the policy answers as it did at that check."""
    from safetensors.torch import load_file

    from rlhf_core.health.records import Finding
    from rlhf_core.health.watch import Watch

    spec = LoadSpec.from_config(ModelConfig(lora=LoraSettings(r=4, alpha=8)), "cpu")
    torch.manual_seed(0)
    load_pretrained(tiny_model_dir, spec, "new_head").save(tmp_path / "rm")
    models = ppo_models(tiny_model_dir, tiny_model_dir, tmp_path / "rm", tmp_path / "rm", spec)
    tok = load_tokenizer(tiny_model_dir, spec)
    cfg = PPOConfig(iterations=3, rollout_batch_size=4, num_minibatches=1, ppo_epochs=2,
                    max_new_tokens=6, optim=OptimConfig(lr=1e-2))
    tr = PPOTrainer(models, tokenizer=tok, prompt_ids=[encode(tok, p) for p in PROMPTS],
                    cfg=cfg, norm_stats={"mean": 0.0, "std": 1.0, "n": 1},
                    device=torch.device("cpu"), generator=torch.Generator().manual_seed(0))
    watch = Watch(cfg.health, None, 1, tmp_path / "healthy")
    ids = torch.tensor([encode(tok, PROMPTS[2])])
    tr.step()
    watch._snapshot(tr, 1)  # as a healthy check after iteration 1 would
    with torch.no_grad():
        at_1 = models.policy(input_ids=ids).logits
    saved = load_file(str(tmp_path / "healthy" / "iter_00000001" / "policy.safetensors"))
    assert saved and all("lora_" in name for name in saved)  # no frozen base weight
    tr.step()
    with torch.no_grad():
        assert not torch.equal(models.policy(input_ids=ids).logits, at_1)
    assert watch.restore_healthy(tr, Finding("kl_spike", 2, 2, 1, {}, "x")) == 1
    with torch.no_grad():
        assert torch.equal(models.policy(input_ids=ids).logits, at_1)


def test_an_adapter_keeps_only_the_embedding_rows_the_vocabulary_grew_by(tiny_model_dir,
                                                                        tmp_path):
    """A PAD added to the vocabulary: the adapter folder holds that one row (not the whole
    frozen matrix), its base is read for the rest, and the loaded policy answers as the
    trained one; on a base of another size the folder says it belongs elsewhere."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    base = load_pretrained(tiny_model_dir, LoadSpec())
    rows = base.get_input_embeddings().num_embeddings
    torch.manual_seed(0)
    base.resize_token_embeddings(rows + 1)  # mean-resized: a row drawn at random
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():  # a trained adapter: B away from 0
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    tok = load_tokenizer(tiny_model_dir, LoadSpec())
    ids = torch.tensor([[*encode(tok, PROMPTS[0]), rows]])  # the added token too
    with torch.no_grad():
        want = model(input_ids=ids).logits
    save_policy_adapter(model, tok, tmp_path / "policy", tiny_model_dir, rows)
    saved = load_file(str(tmp_path / "policy" / "embeddings.safetensors"))
    assert saved["input"].shape == (1, base.config.hidden_size)
    loaded = load_pretrained(tmp_path / "policy", LoadSpec(), trainable=False)
    assert loaded.get_input_embeddings().num_embeddings == rows + 1
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)
    wider = tmp_path / "wider"
    bigger = load_pretrained(tiny_model_dir, LoadSpec())
    bigger.resize_token_embeddings(rows + 3)
    bigger.save_pretrained(wider)
    tok.save_pretrained(wider)
    meta = (tmp_path / "policy" / "rlhf_lora.json")
    meta.write_text(meta.read_text().replace(str(tiny_model_dir), str(wider)))
    with pytest.raises(ValueError, match=f"rows added to a {rows}-row vocabulary, but its "
                       f"base has {rows + 3} rows"):
        load_pretrained(tmp_path / "policy", LoadSpec(), trainable=False)


def test_adding_adapters_shows_no_warning_about_peft_reading_a_renamed_property(
        tiny_model_dir):
    """peft reads ``is_gradient_checkpointing``, which transformers warns about on each read:
    not the user's call, so not shown (make smollm2 printed it once per adapted model)."""
    import warnings

    from rlhf_core.models.loader import add_lora, enable_checkpointing

    model = load_pretrained(tiny_model_dir, LoadSpec())
    enable_checkpointing(model)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        add_lora(model, LoraSettings(r=4, target_modules=["c_attn"]))
    assert not [w for w in seen if "is_gradient_checkpointing" in str(w.message)]


def test_a_new_lora_critic_head_trains_in_fp32_over_a_bf16_trunk(tiny_model_dir, tmp_path):
    """Under bf16 the frozen trunks load in bf16; the new critic head (trained) stays fp32
    master weights, as the critic warm-started from the reward model's head does."""
    spec = LoadSpec.from_config(ModelConfig(lora=LoraSettings(r=4, alpha=8), precision="bf16"),
                                "cpu")
    load_pretrained(tiny_model_dir, LoadSpec(), "new_head").save(tmp_path / "rm")
    for new_head in (True, False):
        models = ppo_models(tiny_model_dir, tiny_model_dir, tiny_model_dir, tmp_path / "rm",
                            spec, new_head=new_head)
        value = models.value_model
        assert next(value.backbone.parameters()).dtype == torch.bfloat16
        assert value.head.weight.dtype == torch.float32 and value.head.weight.requires_grad
