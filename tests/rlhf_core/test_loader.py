"""The one model loader: model.dtype, precision, attention and trust_remote_code reach every
from_pretrained call, and no task or core module loads a model any other way."""

import ast
from pathlib import Path

import pytest
import torch
import transformers

from rlhf_core.config import ModelConfig
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
LOADERS = {"load_pretrained", "load_tokenizer", "ppo_models"}
# the only modules allowed to call from_pretrained: the loader's two layers
# the loader and what it calls: the model classes, LoRA, adapter folders (peft's own
# from_pretrained of an adapter), and a GGUF file's one-time conversion (float32, no spec)
ALLOWED = {ROOT / "rlhf_core" / "models" / f
           for f in ("models.py", "loader.py", "adapters.py", "sources.py")}


def is_checkpointing(model) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            yield name, node


def test_every_load_site_goes_through_the_loader_with_a_spec():
    sites = 0
    for path in sorted([*(ROOT / "tasks").rglob("*.py"), *(ROOT / "rlhf_core").rglob("*.py")]):
        for name, node in _calls(path):
            if name == "from_pretrained":
                assert path in ALLOWED, f"{path.name}:{node.lineno} calls from_pretrained"
            if name in {"load_causal_lm", "from_causal_lm", "load"} and "tasks" in path.parts:
                # ScalarHeadModel.load / load_causal_lm bypass the spec
                assert name == "load" and isinstance(node.func, ast.Attribute) and \
                    getattr(node.func.value, "id", "") not in {"ScalarHeadModel"}, \
                    f"{path.name}:{node.lineno} loads a model without the loader"
            if name in LOADERS and path not in ALLOWED:
                sites += 1
                assert len(node.args) >= 2, f"{path.name}:{node.lineno}: {name} without a spec"
    assert sites >= 12  # sft, reward model, norm, critic, ppo (2), evaluate (4+2), validate


@pytest.fixture()
def recorded(monkeypatch):
    """Every from_pretrained call's keyword arguments, by class."""
    calls = []
    for cls in (transformers.AutoModelForCausalLM, transformers.AutoModel,
                transformers.AutoTokenizer):
        original = cls.from_pretrained.__func__

        def wrapper(klass, *args, _orig=original, _name=cls.__name__, **kwargs):
            calls.append((_name, kwargs))
            return _orig(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(wrapper))
    return calls


def test_spec_reaches_every_from_pretrained(tiny_model_dir, tmp_path, recorded):
    cfg = ModelConfig(dtype="float32", precision="bf16", attn_implementation="eager",
                      trust_remote_code=True, gradient_checkpointing=True)
    spec = LoadSpec.from_config(cfg, "cpu")
    load_tokenizer(tiny_model_dir, spec)
    policy = load_pretrained(tiny_model_dir, spec)
    ref = load_pretrained(tiny_model_dir, spec, trainable=False)
    rm = load_pretrained(tiny_model_dir, spec, "new_head")
    rm.save(tmp_path / "rm")
    value = load_pretrained(tmp_path / "rm", spec, "scalar")
    frozen_rm = load_pretrained(tmp_path / "rm", spec, "scalar", trainable=False)
    assert len(recorded) == 6
    for name, kwargs in recorded:
        assert kwargs["trust_remote_code"] is True, name
        if name != "AutoTokenizer":
            assert kwargs["attn_implementation"] == "eager", name
    # trained models keep fp32 master weights; frozen ones load in the compute dtype
    for model in (policy, rm, value):
        assert next(model.parameters()).dtype == torch.float32
        assert any(p.requires_grad for p in model.parameters())
    for model in (ref, frozen_rm):
        assert next(model.parameters()).dtype == torch.bfloat16
        assert not any(p.requires_grad for p in model.parameters())
    assert is_checkpointing(policy) and is_checkpointing(value)
    assert not is_checkpointing(ref)


def test_model_dtype_is_the_trained_parameter_dtype(tiny_model_dir):
    spec = LoadSpec.from_config(ModelConfig(dtype="bfloat16", precision="fp32"), "cpu")
    assert next(load_pretrained(tiny_model_dir, spec).parameters()).dtype == torch.bfloat16


def test_precision_auto_is_fp32_on_cpu_and_fp16_on_cpu_is_refused():
    assert LoadSpec.from_config(ModelConfig(), "cpu").precision == "fp32"
    with pytest.raises(ValueError, match="fp16 needs CUDA"):
        LoadSpec.from_config(ModelConfig(precision="fp16"), "cpu")


def test_loaded_models_use_the_fused_tanh_gelu_with_the_same_outputs(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    from transformers.activations import NewGELUActivation

    from rlhf_core.models.loader import TanhGELU

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert any(isinstance(m, NewGELUActivation) for m in plain.modules())  # gelu_new in HF
    policy = load_pretrained(tiny_model_dir, LoadSpec()).eval()
    scalar = load_pretrained(tiny_model_dir, LoadSpec(), "new_head")
    for model in (policy, scalar):
        assert not any(isinstance(m, NewGELUActivation) for m in model.modules())
        assert sum(isinstance(m, TanhGELU) for m in model.modules()) == 2  # one per layer
    ids = torch.randint(0, 20, (3, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(policy(ids).logits, plain(ids).logits, atol=1e-5, rtol=1e-5)
    policy.save_pretrained(tmp_path / "saved")  # the saved config keeps its activation
    assert "gelu_new" in (tmp_path / "saved" / "config.json").read_text()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_lm_head_gets_a_contiguous_input_in_bf16_with_the_same_bits(tiny_model_dir,
                                                                          precision):
    """transformers slices the rows it keeps logits for; a frozen model in bf16 hands its head
    a contiguous copy (a strided bf16 input is a slow path on a CPU), with the same logits and
    gradients as without the copy; fp32 is left as it was."""
    spec = LoadSpec.from_config(ModelConfig(precision=precision), "cpu")
    model = load_pretrained(tiny_model_dir, spec, trainable=False)
    head, seen = model.get_output_embeddings(), []
    head.register_forward_pre_hook(lambda mod, args: seen.append(args[0].is_contiguous()))
    hooks = dict(head._forward_pre_hooks)  # the loader's, then the one above
    ids = torch.randint(0, 20, (4, 9), generator=torch.Generator().manual_seed(0))

    def run(keep: int, hooked: bool) -> tuple[torch.Tensor, torch.Tensor]:
        head._forward_pre_hooks.clear()
        head._forward_pre_hooks.update(hooks if hooked else {})
        embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=embeds, logits_to_keep=keep).logits
        logits.float().pow(2).sum().backward()
        return logits.detach(), embeds.grad

    for keep in (1, 5):
        (a, grad_a), (b, grad_b) = run(keep, True), run(keep, False)
        assert torch.equal(a, b) and torch.equal(grad_a, grad_b)
    assert seen == [precision == "bf16"] * 2  # copied in bf16 only


def test_optimizer_uses_the_fused_adamw_kernel_on_cpu():
    from rlhf_core.config import OptimConfig
    from rlhf_core.train.optim import build_optimizer

    params = [torch.nn.Parameter(torch.randn(4, 3))]
    optimizer, _ = build_optimizer(params, OptimConfig(lr=0.1), 10)
    assert optimizer.defaults["fused"] is True
    reference = torch.optim.AdamW([torch.nn.Parameter(params[0].detach().clone())], lr=0.1,
                                  eps=1e-5, weight_decay=0.0, foreach=False)
    for opt, p in ((optimizer, params[0]), (reference, reference.param_groups[0]["params"][0])):
        p.grad = torch.ones_like(p)
        opt.step()
    torch.testing.assert_close(params[0], reference.param_groups[0]["params"][0])
