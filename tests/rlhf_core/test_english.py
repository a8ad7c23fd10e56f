"""The real-English task: the gold judge on recorded answers, requests found in rendered
prompts, held-out prompts disjoint from training and from the tax's probe, and the data
files written from a model's answers (a scripted sampler here)."""

from __future__ import annotations

import json
import random

import pytest

from rlhf_core import english
from rlhf_core.english import (
    FACTS,
    INSTRUCTIONS,
    EnglishSizes,
    Request,
    generate_english_data,
    judge_score,
    parse_request,
    pool,
)
from rlhf_core.eval.tax import PROBE_FILE

ONE_WORD = "Answer in one word. What is the capital of France?"
LOWER = "Answer in lowercase letters only. What is 2 plus 2?"
EXCLAIM = "Answer in one sentence that ends with an exclamation mark. Which animal says meow?"
OPENING = 'Start your answer with "The answer is". What color is a lemon?'
SENTENCE = "Answer in one complete sentence. Who wrote Macbeth?"
FIVE = "Answer in at most five words. What is the opposite of wet?"


@pytest.mark.parametrize("prompt, answer, score", [
    (ONE_WORD, "Paris.", 4.0),                                   # right, kept
    (ONE_WORD, "The capital of France is Paris.", 0.5),          # right, broken
    (ONE_WORD, "Lyon.", 1.0),                                    # wrong, kept
    (ONE_WORD, "sure , cats are nice .", -3.5),                  # wrong, broken, off question
    (LOWER, "the answer is 4.", 4.0),
    (LOWER, "The answer is 4.", 0.5),
    (EXCLAIM, "A cat says meow!", 4.0),
    (EXCLAIM, "A cat says meow. It is cute!", 0.5),              # two sentences
    (OPENING, "The answer is yellow.", 4.0),
    (OPENING, "Yellow.", 0.5),
    (SENTENCE, "Macbeth was written by Shakespeare.", 4.0),
    (SENTENCE, "Shakespeare.", 0.5),                             # too short to be a sentence
    (FIVE, "The opposite is dry.", 4.0),
    (FIVE, "The opposite of wet is dry.", 0.5),                  # seven words
])
def test_the_judge_scores_recorded_answers(prompt, answer, score):
    assert judge_score(prompt, answer) == pytest.approx(score)


def test_the_instruction_rules_read_the_instruction_only():
    ask = [{"role": "system", "content": english.SYSTEM},
           {"role": "user", "content": "Answer in one word. What is the capital of France?"}]
    assert english.instruction_rules(
        [ask, ask, ask, "hello :", "Answer in lowercase letters only. What is the capital of "
         "France?"], ["Paris", "Lyon", "The capital is Paris.", "sure", "paris"]) == \
        [1.0, 1.0, -1.0, None, 1.0]  # a wrong fact that keeps the instruction still scores 1


def test_the_judge_charges_length_and_a_missing_end():
    long = "Paris " + "and more words " * 8
    assert judge_score(ONE_WORD, long) == pytest.approx(2.0 - 1.5 - 0.1 * (25 - 15))
    assert judge_score(ONE_WORD, "Paris.", has_eos=False) == pytest.approx(1.0)
    assert judge_score(ONE_WORD, "") == pytest.approx(-3.0)


def test_the_request_is_found_inside_a_chat_templates_rendering():
    rendered = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                f"{ONE_WORD}<|im_end|>\n<|im_start|>assistant\n")
    assert parse_request(rendered) == Request("Answer in one word.",
                                              "What is the capital of France?")
    assert parse_request("user : describe cats assistant :") is None
    assert judge_score("no task here", "a b c") == 0.0


def test_held_out_requests_are_a_third_and_disjoint_from_training():
    train, held = set(pool(False)), set(pool(True))
    assert not train & held and len(train) + len(held) == len(FACTS) * len(INSTRUCTIONS)
    assert 0.25 < len(held) / (len(train) + len(held)) < 0.42
    assert {r.question for r in held} <= set(FACTS)


def test_no_task_question_is_a_probe_question():
    probe = {json.loads(line)["question"] for line in PROBE_FILE.read_text().splitlines()}
    assert not probe & set(FACTS)


def _sampler():
    rng = random.Random(0)
    return lambda prompts, k: _scripted(prompts, k, rng)


def _scripted(prompts, k, rng):
    """Answers that keep or break each request's instruction, some unfinished."""
    out = []
    for p in prompts:
        req = parse_request(p[-1]["content"])
        right = FACTS[req.question][0]
        options = [(right, True), (f"The answer is {right}, I think. Yes.", True),
                   (f"{right.lower()}", True), ("I do not know.", True),
                   ("Something else entirely", False)]
        out.append([rng.choice(options) for _ in range(k)])
    return out


def test_the_data_files_are_written_from_the_samplers_answers(tmp_path):
    sizes = EnglishSizes(n_sft=20, n_pref=30, n_prompts=10, n_eval=12, n_pref_eval=8)
    paths = generate_english_data(tmp_path, _sampler(),
                                  seed=3, sizes=sizes)
    rows = {role: [json.loads(x) for x in p.read_text().splitlines()] for role, p in paths.items()}
    assert {k: len(v) for k, v in rows.items()} == {
        "sft": 20, "preference": 30, "preference_eval": 8, "prompts": 10, "eval_prompts": 12}
    held = {r.text for r in pool(True)}
    for role in ("prompts", "eval_prompts"):
        texts = {r["prompt"][-1]["content"] for r in rows[role]}
        assert (texts <= held) is (role == "eval_prompts") and (texts & held) == \
            (texts if role == "eval_prompts" else set())
    assert rows["sft"][0]["messages"][0] == {"role": "system", "content": english.SYSTEM}
    pairs = set()
    for pair in rows["preference"]:  # two distinct finished answers, never an unfinished one
        a, b = pair["chosen"][0]["content"], pair["rejected"][0]["content"]
        assert a != b and "Something else entirely" not in (a, b)
        q = pair["prompt"][-1]["content"]
        assert judge_score(q, a) != judge_score(q, b)  # a judge tie makes no pair
        pairs.add((pair["prompt"][-1]["content"], frozenset((a, b))))
    assert len(pairs) == len(rows["preference"])  # no pair twice
    assert all("Something else" not in r["messages"][-1]["content"] for r in rows["sft"])
    # the same seed writes the same files
    again = generate_english_data(tmp_path / "again",
                                  _sampler(),
                                  seed=3, sizes=sizes)
    assert all(again[r].read_text() == paths[r].read_text() for r in paths)


def test_a_sampler_that_never_gives_two_finished_answers_is_refused(tmp_path):
    sizes = EnglishSizes(n_sft=2, n_pref=4, n_prompts=1, n_eval=1, n_pref_eval=1)
    with pytest.raises(ValueError, match="preference: 0 of 4 rows after 20 rounds"):
        generate_english_data(tmp_path, lambda p, k: [[("same", True)] * k for _ in p],
                              sizes=sizes)


def test_rare_pairs_still_fill_the_file_by_drawing_a_batch_each_round(tmp_path):
    """One request in eight gets two answers the judge tells apart; drawing only the missing
    count each round would leave the file short after twenty rounds."""
    seen = iter(range(10**6))

    def sparse(prompts, k):
        out = []
        for p in prompts:
            i = next(seen)
            right = FACTS[parse_request(p[-1]["content"]).question][0]
            out.append([(right, True), (f"I do not know {i}.", True)] if i % 8 == 0
                       else [("same", True)] * k)
        return out

    sizes = EnglishSizes(n_sft=1, n_pref=30, n_prompts=1, n_eval=1, n_pref_eval=1)
    paths = generate_english_data(tmp_path, lambda p, k: sparse(p, k) if k == 2 else
                                  [[("Paris", True)] * k for _ in p], sizes=sizes)
    assert len(paths["preference"].read_text().splitlines()) == 30
