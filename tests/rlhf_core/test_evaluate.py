"""Evaluation: SFT vs PPO summary, reward over-optimisation (RM vs judge), no self-KL."""

import statistics

import pytest
import torch

from rlhf_core.config import Sampling
from rlhf_core.eval.evaluate import compare_policies, rm_judge_gap, sample_policy
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer


def _samples(scores, responses):
    return {"response": responses, "has_eos": [True] * len(scores),
            "length": [3] * len(scores), "score": scores, "kl": [0.5] * len(scores)}


def test_gap_is_rm_gain_minus_judge_gain_in_baseline_deviations():
    gap = rm_judge_gap(3.0, 1.0, rm_base=(1.0, 1.0), judge_base=(1.0, 2.0))
    assert gap == {"rm_gain_z": 2.0, "judge_gain_z": 0.0, "rm_judge_gap_z": 2.0}
    assert rm_judge_gap(1.0, 1.0, (1.0, 0.0), (0.0, 1.0))["rm_gain_z"] != \
        rm_judge_gap(1.0, 1.0, (1.0, 0.0), (0.0, 1.0))["rm_gain_z"]  # nan: no spread


def test_compare_reports_rm_vs_judge_per_sample_and_overall():
    """The policy pleases the RM (scores up) while the judge sees no change: a positive gap,
    per sample and overall, against a naive computation over the SFT samples."""
    prompts = ["p1", "p2", "p3", "p4"]
    judge_values = {"a": 0.0, "b": 1.0, "c": 2.0, "d": 3.0}
    sft = _samples([0.0, 1.0, 2.0, 3.0], ["a", "b", "c", "d"])
    pol = _samples([4.0, 5.0, 6.0, 7.0], ["a", "b", "c", "d"])
    metrics, rows = compare_policies(sft, pol, prompts, lambda p, r, e: judge_values[r])
    sd = statistics.pstdev([0.0, 1.0, 2.0, 3.0])
    assert metrics["eval/rm_gain_z"] == pytest.approx(4.0 / sd)
    assert metrics["eval/judge_gain_z"] == pytest.approx(0.0)
    assert metrics["eval/rm_judge_gap_z"] == pytest.approx(4.0 / sd)
    assert metrics["eval/rm_judge_correlation"] == pytest.approx(
        statistics.correlation([*sft["score"], *pol["score"]], [0, 1, 2, 3] * 2))
    for row in rows:
        assert row["policy_rm_judge_gap_z"] == pytest.approx(
            (row["policy_rm_score"] - 1.5) / sd - (row["policy_judge_score"] - 1.5) / sd)
    no_judge, rows = compare_policies(sft, pol, prompts, None)
    assert not any("judge" in k for k in no_judge) and "policy_judge_score" not in rows[0]


def test_sft_samples_carry_no_kl_to_themselves(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    policy = load_pretrained(tiny_model_dir, LoadSpec())
    rm = load_pretrained(tiny_model_dir, LoadSpec(), "new_head")
    prompts = ["hello :", "tell me about cats :"]
    torch.manual_seed(0)
    sampling = Sampling(temperature=0.7, max_new_tokens=4)
    alone = sample_policy(policy, None, rm, tok, prompts, sampling, device=torch.device("cpu"))
    assert alone["kl"] == [] and len(alone["score"]) == 2
    torch.manual_seed(0)
    against = sample_policy(policy, policy, rm, tok, prompts, sampling,
                            device=torch.device("cpu"))
    assert against["kl"] == pytest.approx([0.0, 0.0], abs=1e-5)
    assert against["response"] == alone["response"]
