"""tasks/retrain/labels/collect.py:build_record: a collection whose own pairs hold too few clear
ones (a champion answering alike) still carries collect.known_pairs known-answer pairs, topped up
with demo responses the judge orders as clearly, so every labeller can be judged."""

from __future__ import annotations

from rlhf_core.demo import judge_score
from tasks.config.pipeline_config import load_config
from tasks.retrain.labels.collect import build_record
from tests.shared import TEST_CONFIG


def test_too_few_clear_pairs_are_topped_up_to_known_pairs():
    cfg = load_config(TEST_CONFIG)
    prompts = [f"tell me about {t} :" for t in ("cats", "dogs", "rain", "sun")] * 3
    prompts = [f"{p} {i}" for i, p in enumerate(prompts)]
    # every answer alike in quality: no pair is 2 judge points apart
    responses = [[f"sure , cats are nice {k} ." for k in range(4)] for _ in prompts]
    scores = [[0.0, 1.0, 0.0, 1.0] for _ in prompts]
    rows, counts = build_record(cfg, "v1-x", prompts, responses, scores, seed=0)
    known = [r for r in rows if r["known"]]
    assert counts["known"] == len(known) == cfg.collect.known_pairs == 40
    assert len(rows) - len(known) == 2 * len(prompts)  # the collected pairs all stay to label
    for r in known:
        gap = judge_score(r["prompt"], r["response_a"]) - judge_score(r["prompt"], r["response_b"])
        assert abs(gap) >= 2.0 and r["known"] == ("a" if gap > 0 else "b")
        assert r["prompt"] in prompts
