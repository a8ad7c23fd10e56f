"""The synthetic demo task: data determinism, held-out splits, the gold judge, assets."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from rlhf_core.demo import (
    EOS,
    PAD,
    TOPICS,
    DemoSizes,
    all_prompts,
    build_demo_assets,
    generate_demo_data,
    judge_score,
    prompt_topic,
    sample_response,
)
from tests.shared import label_agreement

FILES = ("sft", "preference", "prompts", "eval_prompts", "preference_eval")
SMALL = DemoSizes(n_sft=300, n_pref=300, n_prompts=200, n_eval=64, n_pref_eval=100)
PROMPT = "user : please describe cats briefly assistant :"


def best_response(prompt: str) -> str:
    """The judge's ideal answer: polite, on the prompt's topic, positive, signed off."""
    topic = prompt_topic(prompt) or TOPICS[0]
    return f"sure , {topic} are nice . hope this helps ."


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def default_data(tmp_path_factory):
    """The data files at the default sizes (pure Python, fast)."""
    return generate_demo_data(tmp_path_factory.mktemp("demo_default"), seed=0)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return build_demo_assets(tmp_path_factory.mktemp("demo_assets"), seed=0, sizes=SMALL)


# ----------------------------------------------------------------------------- data files


def test_generate_writes_the_five_files_with_the_requested_sizes(tmp_path):
    paths = generate_demo_data(tmp_path / "d", seed=3, sizes=SMALL)
    assert set(paths) == set(FILES)
    expected = {"sft": 300, "preference": 300, "prompts": 200, "eval_prompts": 64,
                "preference_eval": 100}
    for name, n in expected.items():
        assert paths[name].parent == tmp_path / "d"
        assert len(_rows(paths[name])) == n
    assert all(set(r) == {"prompt", "response"} for r in _rows(paths["sft"]))
    for name in ("preference", "preference_eval"):
        rows = _rows(paths[name])
        assert all(set(r) == {"prompt", "chosen", "rejected"} for r in rows)
        assert all(r["chosen"] != r["rejected"] for r in rows)
    known = set(all_prompts())
    assert all(r["prompt"] in known for name in FILES for r in _rows(paths[name]))


def test_same_seed_gives_identical_files_and_another_seed_differs(tmp_path):
    a = generate_demo_data(tmp_path / "a", seed=7, sizes=SMALL)
    b = generate_demo_data(tmp_path / "b", seed=7, sizes=SMALL)
    c = generate_demo_data(tmp_path / "c", seed=8, sizes=SMALL)
    for name in FILES:
        assert a[name].read_bytes() == b[name].read_bytes(), name
    for name in ("sft", "preference", "prompts", "preference_eval"):
        assert a[name].read_bytes() != c[name].read_bytes(), name


def test_build_assets_is_deterministic_for_a_seed(tmp_path):
    build_demo_assets(tmp_path / "a", seed=1, sizes=SMALL)
    build_demo_assets(tmp_path / "b", seed=1, sizes=SMALL)
    build_demo_assets(tmp_path / "c", seed=2, sizes=SMALL)
    ta, tb, tc = _tree(tmp_path / "a"), _tree(tmp_path / "b"), _tree(tmp_path / "c")
    assert "base_model/model.safetensors" in ta and "data/sft.jsonl" in ta
    assert ta == tb
    assert ta["base_model/model.safetensors"] != tc["base_model/model.safetensors"]
    assert ta["data/sft.jsonl"] != tc["data/sft.jsonl"]


def test_held_out_prompts_never_appear_in_training_files(default_data):
    train = {r["prompt"] for name in ("prompts", "sft", "preference")
             for r in _rows(default_data[name])}
    eval_prompts = {r["prompt"] for r in _rows(default_data["eval_prompts"])}
    pref_eval = {r["prompt"] for r in _rows(default_data["preference_eval"])}
    assert len(train) > 100 and len(eval_prompts) > 50 and len(pref_eval) > 50
    assert not train & eval_prompts
    assert not train & pref_eval
    # every topic is still covered on both sides: held out by combination, not by topic
    assert {prompt_topic(p) for p in train} == set(TOPICS)
    assert {prompt_topic(p) for p in eval_prompts} == set(TOPICS)


def test_label_agreement_of_generated_preferences(default_data):
    rows = _rows(default_data["preference"])
    agreement = label_agreement(rows)
    assert 0.75 <= agreement <= 0.92
    flipped = [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in rows]
    assert label_agreement(flipped) == pytest.approx(1 - agreement)
    assert 0.75 <= label_agreement(_rows(default_data["preference_eval"])) <= 0.95


def _longer_chosen(rows: list[dict]) -> float:
    return statistics.fmean(len(r["chosen"].split()) > len(r["rejected"].split()) for r in rows)


def test_a_length_biased_rater_labels_only_the_reward_models_pairs(tmp_path, default_data):
    biased = generate_demo_data(tmp_path, seed=0, rm_length_bias=1.0)
    for name in ("sft", "prompts", "eval_prompts", "preference_eval"):  # the judge's pairs too
        assert biased[name].read_bytes() == default_data[name].read_bytes(), name
    plain, rated = _rows(default_data["preference"]), _rows(biased["preference"])
    # the same pairs, drawn with the same random numbers: only some labels turn
    assert [{r["chosen"], r["rejected"]} for r in rated] == \
        [{r["chosen"], r["rejected"]} for r in plain]
    assert _longer_chosen(rated) > _longer_chosen(plain) + 0.15
    assert label_agreement(rated) < label_agreement(plain)  # the gold judge agrees less
    assert generate_demo_data(tmp_path / "zero", seed=0, rm_length_bias=0.0)[
        "preference"].read_bytes() == default_data["preference"].read_bytes()


def test_best_response_beats_the_average_demonstration(default_data):
    sft = _rows(default_data["sft"])
    demo_mean = statistics.mean(judge_score(r["prompt"], r["response"]) for r in sft)
    best_mean = statistics.mean(judge_score(r["prompt"], best_response(r["prompt"]))
                                for r in sft)
    assert best_mean > demo_mean + 2
    assert all(judge_score(r["prompt"], best_response(r["prompt"]))
               >= judge_score(r["prompt"], r["response"]) for r in sft)


# ----------------------------------------------------------------------------- gold judge


def test_judge_prefers_on_topic():
    assert judge_score(PROMPT, "cats are nice .") > judge_score(PROMPT, "dogs are nice .")
    assert judge_score(PROMPT, "cats are nice .") > judge_score(PROMPT,
                                                                "cats are nice , dogs are fun .")


def test_judge_ranks_a_polite_off_topic_answer_below_a_rude_on_topic_one():
    """The demo's headline win rate must measure answers to the question asked: politeness
    cannot make up for ignoring the topic (seen: "describe fish" -> "... bread ...")."""
    fish = "user : describe fish assistant :"
    off_topic = "sure , bread are calm . hope this helps ."
    assert judge_score(fish, off_topic) < judge_score(fish, "ugh , fish are calm . whatever .")
    assert judge_score(fish, off_topic) < judge_score(fish, "fish are um like calm")
    assert judge_score(fish, "sure , fish are calm , bread are nice . hope this helps .") < \
        judge_score(fish, "sure , fish are calm . hope this helps .")


def test_judge_rewards_polite_closer():
    base = judge_score(PROMPT, "cats are nice .")
    assert judge_score(PROMPT, "cats are nice . hope this helps .") > base
    assert judge_score(PROMPT, "cats are nice . hope this helps") > \
        judge_score(PROMPT, "cats are nice")
    assert judge_score(PROMPT, "sure , cats are nice .") > base


def test_judge_penalises_rude_words_and_fillers():
    base = judge_score(PROMPT, "cats are nice .")
    assert judge_score(PROMPT, "ugh , cats are nice .") < base
    assert judge_score(PROMPT, "cats are nice . whatever .") < base
    assert judge_score(PROMPT, "cats are um nice .") < base
    assert judge_score(PROMPT, "cats like are basically nice .") < \
        judge_score(PROMPT, "cats are basically nice .")


def test_judge_penalises_missing_eos_by_three():
    for response in ("cats are nice .", "ugh , dogs are um fun", best_response(PROMPT)):
        assert judge_score(PROMPT, response, has_eos=False) == \
            pytest.approx(judge_score(PROMPT, response) - 3.0)


def test_judge_penalises_excess_length():
    short = "cats are nice ."
    long = "cats are nice , cats are nice , cats are nice , cats are nice ."
    assert len(long.split()) > 12
    assert judge_score(PROMPT, long) < judge_score(PROMPT, short)


def test_sample_response_mixes_qualities_and_stays_on_vocabulary():
    rng = random.Random(0)
    responses = [sample_response(PROMPT, rng) for _ in range(300)]
    scores = [judge_score(PROMPT, r) for r in responses]
    assert max(scores) - min(scores) > 4  # a real spread of quality
    assert any("cats" in r.split() for r in responses)
    assert any("cats" not in r.split() for r in responses)
    rng2 = random.Random(0)
    assert [sample_response(PROMPT, rng2) for _ in range(300)] == responses


# ----------------------------------------------------------------------------- tokenizer, model


def test_tokenizer_round_trip_and_specials(assets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(assets["base_model"])
    assert tok.eos_token == EOS and tok.pad_token == PAD
    assert tok.eos_token_id != tok.pad_token_id
    texts = [r["response"] for r in _rows(assets["sft"])]
    texts += [r["prompt"] for r in _rows(assets["eval_prompts"])]
    texts += [best_response(PROMPT), PROMPT]
    specials = {tok.eos_token_id, tok.pad_token_id, tok.unk_token_id}
    for text in texts:
        ids = tok(text)["input_ids"]
        assert len(ids) == len(text.split())  # one id per word, nothing added
        assert not specials & set(ids)
        assert tok.decode(ids) == text
    ids = tok(PROMPT + " " + EOS)["input_ids"]
    assert ids[-1] == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == PROMPT


def test_model_folder_loads_and_generates(assets):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(assets["base_model"])
    model = AutoModelForCausalLM.from_pretrained(assets["base_model"]).eval()
    assert model.config.vocab_size == len(tok)
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.config.pad_token_id == tok.pad_token_id
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                             do_sample=False, pad_token_id=tok.pad_token_id)
    assert logits.shape == (1, ids.shape[1], len(tok))
    assert torch.isfinite(logits).all()
    assert torch.equal(out[0, : ids.shape[1]], ids[0])
    assert ids.shape[1] < out.shape[1] <= ids.shape[1] + 5
    assert int(out.max()) < len(tok)


def test_clear_pairs_are_ordered_by_the_judge_by_the_gap():
    from rlhf_core.demo import clear_pairs, judge_score

    prompts = ["tell me about cats :", "describe rain please :"]
    pairs = clear_pairs(prompts, 30, 2.0, seed=1)
    assert len(pairs) == 30 and {p["prompt"] for p in pairs} <= set(prompts)
    for p in pairs:
        gap = judge_score(p["prompt"], p["response_a"]) - judge_score(p["prompt"], p["response_b"])
        assert abs(gap) >= 2.0 and p["known"] == ("a" if gap > 0 else "b")
    assert clear_pairs(prompts, 30, 2.0, seed=1) == pairs  # seeded
