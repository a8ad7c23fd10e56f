"""The alignment tax's pieces: answer matching on recorded answers, bits per byte against a
token-by-token reference, the paired differences, and the greedy probe on a tiny chat model."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlhf_core.eval.tax import (
    PROBE_FILE,
    ProbeItem,
    answer_probe,
    bits_per_byte,
    is_right,
    probe_prompt,
    tax_lost,
    tax_metrics,
    text_nats,
)


@pytest.mark.parametrize("answer, accepted, right", [
    ("The capital of France is Paris.", ("Paris",), True),
    ("paris", ("Paris",), True),
    ("Parisian food is nice.", ("Paris",), False),
    ("2 + 5 = 7", ("7", "seven"), True),
    ("It is 17.", ("7", "seven"), False),
    ("Seven days.", ("7", "seven"), True),
    ("A baby cat is called a kitten; kittens are small.", ("kitten",), True),
    ("They are kittens.", ("kitten",), True),
    ("Carbon dioxide, or CO2.", ("carbon dioxide",), True),
    ("", ("Paris",), False),
    ("sure , France are nice .", ("Paris",), False),
    ("anything", ("", "  "), False),
])
def test_an_answer_is_right_when_it_holds_an_accepted_answer_as_a_whole_word(answer, accepted,
                                                                              right):
    assert is_right(answer, accepted) is right


def test_the_shipped_probe_holds_enough_distinct_checkable_questions():
    rows = [json.loads(line) for line in PROBE_FILE.read_text().splitlines()]
    questions = [r["question"] for r in rows]
    assert len(rows) >= 150 and len(set(questions)) == len(questions)
    assert all(r["answers"] and all(a.strip() for a in r["answers"]) for r in rows)
    # an arithmetic question whose operand is its answer would count a restated question as
    # right ("12 minus 6 is 5" holds "6")
    for r in rows:
        if r["category"] == "arithmetic":
            numbers = [w.strip("?") for w in r["question"].split() if w.strip("?").isdigit()]
            assert not set(numbers) & set(r["answers"]), r["question"]


def test_probe_prompt_is_a_conversation_for_a_chat_model_and_a_frame_otherwise():
    assert probe_prompt("Q?", chat=False) == "Question: Q?\nAnswer:"
    assert probe_prompt("Q?", chat=True) == [{"role": "user", "content": "Q?"}]
    assert probe_prompt("Q?", chat=True, system="S") == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "Q?"}]


def _naive_nats(model, tokenizer, texts):
    """Token by token: -log p(t_i | separator, t_<i) for every token of every text."""
    sep = tokenizer.bos_token_id if tokenizer.bos_token_id is not None \
        else tokenizer.eos_token_id
    total, n_bytes = 0.0, 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        n_bytes += len(tokenizer.decode(ids).encode("utf-8"))
        seq = [sep, *ids]
        for i in range(1, len(seq)):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([seq[:i]])).logits[0, -1].double()
            total -= float(torch.log_softmax(logits, -1)[seq[i]])
    return total, n_bytes


def test_bits_per_byte_matches_a_token_by_token_reference(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    texts = ["user : tell me about cats", "sure , cats are nice . hope this helps", "dogs"]
    nats, n_bytes = text_nats(model, tok, texts, batch_size=2)  # ragged batches, padded
    ref_nats, ref_bytes = _naive_nats(model, tok, texts)
    assert n_bytes == ref_bytes
    assert nats == pytest.approx(ref_nats, rel=1e-4)
    assert bits_per_byte(nats, n_bytes) == pytest.approx(ref_nats / math.log(2) / ref_bytes,
                                                         rel=1e-4)


def test_bits_per_byte_refuses_an_empty_text():
    with pytest.raises(ValueError, match="no text"):
        bits_per_byte(0.0, 0)


def test_tax_metrics_give_accuracies_and_paired_differences_against_a_naive_count():
    right = {"base": [True, True, True, False], "sft": [True, True, False, False],
             "policy": [True, False, False, False]}
    m = tax_metrics(right, {"base": 1.0, "sft": 1.1, "policy": 1.3})
    assert m["eval/tax/probe_acc_base"] == 0.75 and m["eval/tax/probe_acc_policy"] == 0.25
    assert m["eval/tax/probe_diff_policy_base"] == pytest.approx(-0.5)
    assert m["eval/tax/probe_diff_sft_base"] == pytest.approx(-0.25)
    assert m["eval/tax/probe_diff_policy_sft"] == pytest.approx(-0.25)
    assert m["eval/tax/probe_diff_policy_base_low"] <= -0.5 <= \
        m["eval/tax/probe_diff_policy_base_high"]
    assert m["eval/tax/bpb_diff_policy_base"] == pytest.approx(0.3)
    assert tax_lost(m) == pytest.approx(0.5)


def test_without_a_base_there_is_no_loss_to_report():
    m = tax_metrics({"sft": [True], "policy": [False]}, {})
    assert "eval/tax/probe_diff_policy_base" not in m and tax_lost(m) is None
    with pytest.raises(ValueError, match="no probe answers"):
        tax_metrics({"policy": []}, {})


def test_the_probe_is_answered_greedily_and_the_same_twice(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.tiny_chat import build_chat_model

    folder = build_chat_model(tmp_path / "chat")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    items = [ProbeItem("hello world ?", ("cats",)), ProbeItem("tell me about dogs", ("dogs",))]
    seen = []
    first = answer_probe(model, tok, items, max_new_tokens=5, batch_size=1, on_batch=seen.append)
    assert answer_probe(model, tok, items, max_new_tokens=5) == first
    assert len(first) == 2 and all(isinstance(a, str) for a in first) and seen == [1, 2]
