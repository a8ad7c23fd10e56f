import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhf_core.models.data import left_pad
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer
from rlhf_core.models.models import disable_dropout, position_ids_from_mask


def test_load_causal_lm_from_local_folder_turns_dropout_off(tiny_model_dir):
    model = load_pretrained(tiny_model_dir, LoadSpec())
    probs = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert probs and all(p == 0.0 for p in probs)
    assert model.config.resid_pdrop == 0.0 and model.config.attn_pdrop == 0.0
    tok = load_tokenizer(str(tiny_model_dir))
    assert tok.pad_token_id != tok.eos_token_id


def test_disable_dropout_makes_train_mode_deterministic(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, resid_pdrop=0.5)
    model.train()
    ids = torch.tensor([[5, 6, 7, 8]])
    assert not torch.equal(model(ids).logits, model(ids).logits)  # dropout active
    disable_dropout(model)
    assert torch.equal(model(ids).logits, model(ids).logits)


def test_position_ids_skip_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_scalar_head_init_and_left_padding_invariance(tiny_model_dir):
    model = load_pretrained(tiny_model_dir, LoadSpec(), "new_head").eval()
    hidden = model.backbone.config.hidden_size
    assert torch.all(model.head.bias == 0)
    assert abs(model.head.weight.std().item() - (hidden + 1) ** -0.5) < 0.5 * (hidden + 1) ** -0.5
    pad = 2
    seqs = [[5, 6, 7], [8, 9, 10, 11, 12]]
    padded = left_pad(seqs, pad)
    scores = model(padded, padded != pad)
    alone = model(torch.tensor([seqs[0]]), torch.ones(1, 3, dtype=torch.bool))
    torch.testing.assert_close(scores[0, -1], alone[0, -1], atol=1e-5, rtol=1e-5)


def test_scalar_head_save_load_round_trip(tiny_model_dir, tmp_path):
    model = load_pretrained(tiny_model_dir, LoadSpec(), "new_head").eval()
    torch.nn.init.normal_(model.head.weight)
    model.save(tmp_path / "rm")
    assert (tmp_path / "rm" / "head.safetensors").exists()
    loaded = load_pretrained(tmp_path / "rm", LoadSpec(), "scalar").eval()
    ids = torch.tensor([[5, 6, 7, 0]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    torch.testing.assert_close(model(ids, mask), loaded(ids, mask))


def test_scalar_head_load_names_missing_file(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="head.safetensors|backbone"):
        load_pretrained(tmp_path, LoadSpec(), "scalar")


@pytest.mark.parametrize("divide", [False, True])
def test_a_normalised_critic_head_predicts_the_normalised_reward(divide):
    """The critic starts as a copy of the reward model; with its head normalised it outputs
    exactly what PPO's returns are built from, r - mean (or (r - mean) / std)."""
    import copy

    from rlhf_core.models.scoring import normalise_head, normalise_scores

    torch.manual_seed(0)
    head = torch.nn.Linear(8, 1)
    critic = copy.deepcopy(head)
    stats = {"mean": 4.17, "std": 0.44, "n": 256}
    normalise_head(critic, stats, divide)
    hidden = torch.randn(5, 8)
    with torch.no_grad():
        expected = normalise_scores(head(hidden), stats, divide)
        assert torch.allclose(critic(hidden), expected, atol=1e-5)
