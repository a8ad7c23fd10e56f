"""tasks/retrain/labels/collect.py:build_record: a collection whose own pairs hold too few clear
ones (a champion answering alike) still carries collect.known_pairs known-answer pairs, topped up
with pairs the run's gold judge orders as clearly (the demo's responses for the demo, right and
wrong English answers for the English task), so every labeller can be judged."""

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


def test_the_english_task_tops_up_with_english_pairs_on_its_conversations():
    from rlhf_core.english import all_requests, messages
    from rlhf_core.english import judge_score as english

    cfg = load_config(TEST_CONFIG, ["eval.judge=english"])
    prompts = [messages(r) for r in all_requests()[:12]]  # conversations, as the pool keeps
    responses = [["I am not sure.", "I do not know.", "Hard to say.", "No idea."]
                 for _ in prompts]  # all alike to the judge: nothing clear among them
    rows, counts = build_record(cfg, "v1-x", prompts, responses, [[0.0] * 4] * 12, seed=0)
    known = [r for r in rows if r["known"]]
    assert counts["known"] == len(known) == 40
    for r in known:
        assert r["prompt"] in prompts  # the pooled messages, like every other row's
        text = "\n".join(m["content"] for m in r["prompt"])
        gap = english(text, r["response_a"]) - english(text, r["response_b"])
        assert abs(gap) >= 2.0 and r["known"] == ("a" if gap > 0 else "b")
        assert " , " not in r["response_a"] + r["response_b"]  # no demo language
