"""Rewards from several sources: the aggregation against a naive reference (weights, abstaining
rows, both orders), a source's bad answers, and the rollout with a mix on a tiny GPT-2."""

import math
import random

import pytest
import torch

from rlhf_core.config import PPOConfig
from rlhf_core.models.data import encode, left_pad
from rlhf_core.models.models import PPOModels
from rlhf_core.ppo.algorithms import GAE
from rlhf_core.ppo.rewards import (
    RewardMix,
    TextScorer,
    checked_scores,
    combine,
    scored_rows,
    source_metrics,
)
from rlhf_core.ppo.rollout import RolloutSettings, make_experience, sampling_config

NAN = math.nan
PROMPTS = ["tell me about cats :", "hello :", "please tell me about the rain and sun :"]


def naive(parts: dict[str, list[float | None]], weights: dict[str, float], how: str):
    """Row by row: each source's score (whitened over the rows it scored first, for
    normalize_then_sum) times its weight, summed over the sources that scored the row."""
    n = len(next(iter(parts.values())))
    ready = {}
    for name, xs in parts.items():
        seen = [x for x in xs if x is not None]
        if how == "normalize_then_sum" and seen:
            mean = sum(seen) / len(seen)
            std = math.sqrt(sum((x - mean) ** 2 for x in seen) / len(seen))
            xs = [None if x is None else (x - mean) / (std + 1e-8) for x in xs]
        ready[name] = xs
    out = []
    for i in range(n):
        terms = [weights[k] * ready[k][i] for k in parts if ready[k][i] is not None]
        out.append(sum(terms) if terms else None)
    return out


@pytest.mark.parametrize("how", ["sum", "normalize_then_sum"])
def test_combine_matches_a_naive_reference(how):
    rng = random.Random(1)
    for _ in range(20):
        n = rng.randint(1, 7)
        parts = {name: [None if rng.random() < 0.3 else rng.uniform(-3, 3) for _ in range(n)]
                 for name in ("rm", "brevity", "helpful")[: rng.randint(1, 3)]}
        weights = {k: rng.choice([1.0, 0.5, -2.0, 3.0]) for k in parts}
        got = combine({k: checked_scores(k, v, n) for k, v in parts.items()}, weights, how)
        for g, want in zip(got.tolist(), naive(parts, weights, how)):
            assert (math.isnan(g) and want is None) or g == pytest.approx(want, abs=1e-5)


def test_one_source_at_weight_one_is_its_scores_exactly():
    x = torch.randn(9)
    assert torch.equal(combine({"rm": x}, {"rm": 1.0}, "sum"), x)


def test_a_row_no_source_scored_is_dropped_with_its_group():
    combined = torch.tensor([1.0, NAN, 2.0, 3.0, NAN, NAN])
    assert scored_rows(combined).tolist() == [0, 2, 3]
    assert scored_rows(combined, group=2).tolist() == [2, 3]
    assert scored_rows(torch.full((4,), NAN)).tolist() == []


@pytest.mark.parametrize("answer, message", [
    ([1.0, 2.0], "reward source 'brevity' \\(PPO iteration 4\\): 2 scores for 3 rows"),
    ([1.0, math.inf, 0.0], "'brevity' \\(PPO iteration 4\\): row 1 is inf, not a finite"),
    ([1.0, None, "x"], "row 2 is 'x', not a number or None"),
    (7, "returned int, not one score per row"),
])
def test_a_bad_answer_fails_naming_the_source_and_row(answer, message):
    with pytest.raises(ValueError, match=message):
        checked_scores("brevity", answer, 3, iteration=4)


def test_source_metrics_read_each_sources_scores_and_abstentions():
    raw = {"rm": torch.tensor([2.0, 4.0, 6.0]), "f": torch.tensor([1.0, NAN, 3.0])}
    parts = {"rm": raw["rm"] - 4.0, "f": raw["f"]}
    m = source_metrics(raw, parts, "sum", unscored=0.0)
    assert m["reward/rm/raw_mean"] == 4.0 and m["reward/rm/mean"] == 0.0
    assert m["reward/f/abstain_rate"] == pytest.approx(1 / 3)
    assert m["reward/f/raw_std"] == pytest.approx(1.0) and m["reward/unscored_rate"] == 0.0
    whitened = source_metrics(raw, parts, "normalize_then_sum", 0.0)
    assert whitened["reward/f/mean"] == pytest.approx(0.0, abs=1e-6)
    assert whitened["reward/f/std"] == pytest.approx(1.0, abs=1e-4)


def _experience(models, mix, seed=0):
    tok, policy, ref, value, reward = models
    torch.manual_seed(seed)
    prompt_ids = left_pad([encode(tok, p) for p in PROMPTS], tok.pad_token_id)
    return make_experience(PPOModels(policy, ref, value, reward), prompt_ids, tok,
                           sampling_config(tok, 0.7, 6), kl_coef=0.05,
                           norm_stats={"mean": 0.5, "std": 1.0, "n": 1},
                           settings=RolloutSettings(temperature=0.7, kl_estimator="k1",
                                                    missing_eos_penalty=None,
                                                    divide_by_std=False),
                           algorithm=GAE(PPOConfig()), mix=mix, prompt_rows=[10, 11, 12],
                           iteration=3)


def test_a_source_that_abstains_everywhere_leaves_the_reward_models_reward(models):
    alone = _experience(models, RewardMix())
    calls = []

    def never(texts, rows):
        calls.append((texts, rows))
        return [None] * len(texts)

    mixed = _experience(models, RewardMix(scorers=(TextScorer("never", 2.0, never),)))
    assert torch.equal(mixed.scores, alone.scores)
    assert torch.equal(mixed.advantages, alone.advantages)
    assert alone.reward_metrics == {}
    assert mixed.reward_metrics["reward/never/abstain_rate"] == 1.0
    (texts, rows), = calls
    assert rows == [10, 11, 12] and len(texts) == 3


def test_a_function_alone_is_the_reward_and_its_unscored_rows_leave_the_batch(
        models):
    def length(texts, rows):
        return [None if row == 11 else float(len(t)) for t, row in zip(texts, rows)]

    exp = _experience(models, RewardMix(model_name=None,
                                        scorers=(TextScorer("length", 1.0, length),)))
    assert exp.responses.shape[0] == 2  # row 11 was no one's
    assert torch.equal(exp.scores, exp.raw_scores)
    assert exp.reward_metrics["reward/unscored_rate"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="PPO iteration 3: no reward source scored any of "
                       "the 3 responses"):
        _experience(models, RewardMix(model_name=None, scorers=(
            TextScorer("none", 1.0, lambda t, r: [None] * len(t)),)))


def test_a_source_that_raises_or_answers_nan_fails_the_iteration_naming_it(
        models):
    with pytest.raises(ValueError, match="'bad' \\(PPO iteration 3\\): row 0 is nan"):
        _experience(models, RewardMix(scorers=(
            TextScorer("bad", 1.0, lambda t, r: [math.nan] * len(t)),)))

    def broken(texts, rows):
        raise KeyError("title")

    with pytest.raises(ValueError, match="reward source 'broken' \\(PPO iteration 3\\) "
                       "failed: KeyError: 'title'"):
        _experience(models, RewardMix(scorers=(TextScorer("broken", 1.0, broken),)))
