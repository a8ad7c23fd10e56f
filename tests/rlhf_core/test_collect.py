"""rlhf_core/eval/collect.py: pairs from k samples (empty, over-budget, identical and repeated pairs
dropped and counted), fresh prompts of a pool (plain or conversations), known-answer pairs from a
judge or a gold file."""

from __future__ import annotations

from rlhf_core.demo import bt_choice, judge_score, training_prompts
from rlhf_core.eval import collect as core


def test_pair_up_drops_empty_identical_and_repeated_pairs_and_counts_them():
    prompts = ["p1", "p2"]
    responses = [["x", "y", "", "z", "y", "x", "u", "u"],  # (x,y) kept, ('',z) empty,
                 ["x", "y", "w", "w"]]                      # (y,x) repeated, (u,u) identical
    pairs, counts = core.pair_up(prompts, responses)
    assert [(p["prompt"], p["response_a"], p["response_b"]) for p in pairs] == \
        [("p1", "x", "y"), ("p2", "x", "y")]  # same texts on another prompt: a new pair
    assert counts == {"candidates": 6, "empty": 1, "over_budget": 0, "identical": 2,
                      "repeated": 1, "kept": 2}
    assert (pairs[0]["index_a"], pairs[0]["index_b"]) == (0, 1)


def test_a_pair_with_a_side_over_the_response_budget_is_dropped_and_counted():
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    responses = [["a", "b", "c", "d"], ["a", "b", "c", "d"]]
    fits = [[True, True, True, False], [True, True, True, True]]
    pairs, counts = core.pair_up([conv, "plain"], responses, fits)
    assert [(p["prompt"], p["response_a"]) for p in pairs] == \
        [(conv, "a"), ("plain", "a"), ("plain", "c")]
    assert counts["over_budget"] == 1 and counts["kept"] == 3


def test_conversations_are_pooled_and_skipped_by_their_messages():
    def conv(q, system="Be brief."):
        return [{"role": "system", "content": system}, {"role": "user", "content": q}]

    pool = core.pool_order([conv("a"), conv("b"), conv("a"), conv("a", "Be long.")], seed=0)
    assert len(pool) == 3  # the same question under another system message is another prompt
    used = {core.prompt_key(pool[0])}
    assert core.fresh_prompts(pool, used, 5) == pool[1:]
    assert core.prompt_key("plain") == "plain"  # the keys of plain pools are unchanged
    assert core.prompt_text(conv("Answer in one word.")) == "Be brief.\nAnswer in one word."


def test_fresh_prompts_skip_used_ones_in_pool_order():
    pool = core.pool_order(["a", "b", "c", "a", " ", "d"], seed=3)
    assert sorted(pool) == ["a", "b", "c", "d"] and pool == core.pool_order(["a", "b", "c", "d"], 3)
    first = core.fresh_prompts(pool, set(), 2)
    second = core.fresh_prompts(pool, set(first), 2)
    assert not set(first) & set(second) and set(first) | set(second) == set(pool)
    assert core.fresh_prompts(pool, set(pool), 2) == []


def test_judged_known_picks_only_clear_pairs_with_the_judges_answer():
    prompt = "user : describe cats assistant :"
    pairs = [{"prompt": prompt, "response_a": "sure , cats are nice .", "response_b": "ugh"},
             {"prompt": prompt, "response_a": "ugh", "response_b": "cats are nice ."},
             {"prompt": prompt, "response_a": "cats are nice", "response_b": "cats are nice ."}]
    known = core.judged_known(pairs, judge_score, n=5, min_gap=2.0)
    assert known == {0: "a", 1: "b"}  # the third differs by 0.5 judge points: not clear
    assert len(core.judged_known(pairs, judge_score, n=1, min_gap=2.0)) == 1


def test_gold_known_keeps_the_chosen_side_as_the_answer():
    gold = [{"prompt": f"p{i}", "chosen": f"good{i}", "rejected": f"bad{i}"} for i in range(20)]
    pairs, answers = core.gold_known(gold, 8, seed=1)
    assert len(pairs) == 8 and set(answers) == {"a", "b"}
    for p, a in zip(pairs, answers):
        assert p["response_" + a].startswith("good")
    mixed = core.shuffled_with_known([{"id": 1}], [{"id": 2}], seed=0)
    assert sorted(r["id"] for r in mixed) == [1, 2]


def test_demo_judge_labels_agree_with_the_judge_and_degraded_ones_reverse_it():
    rows = [{"prompt": p, "response_a": f"sure , {p.split()[-3]} are nice .",
             "response_b": "ugh , bread are calm"} for p in training_prompts()[:200]]
    good = core.judge_choices(rows, judge_score, bt_choice, seed=0)
    bad = core.judge_choices(rows, judge_score, bt_choice, seed=0, degraded=True)
    better = ["a" if judge_score(r["prompt"], r["response_a"]) >
              judge_score(r["prompt"], r["response_b"]) else "b" for r in rows]
    assert sum(g == b for g, b in zip(good, better)) / len(rows) > 0.9
    assert all(b != w for b, w in zip(bad, better))
