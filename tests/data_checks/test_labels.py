"""data_checks/labels.py: labelled rows refused with file and row named; majority vote;
agreement with known answers and with the reward model; the quarantine sentence."""

from __future__ import annotations

import pandas as pd
import pytest

from data_checks.labels import (
    LabelFigures,
    LabelRules,
    agreement_rate,
    check_rows,
    judge_labellers,
    kept_rows,
    known_answers,
    label_figures,
    majority,
    preference_rows,
    quality_refusal,
    read_labelled,
)
from data_checks.loading import DataError

IDS = {"c-0000", "c-0001", "c-0002"}


def _df(rows):
    return pd.DataFrame(rows)


def test_unknown_and_missing_choices_and_foreign_ids_are_refused_naming_file_and_rows():
    df = _df([{"id": "c-0000", "choice": "a"}, {"id": "c-0001", "choice": "maybe"},
              {"id": "c-0002", "choice": ""}, {"id": "x-0009", "choice": "b"},
              {"id": "c-0000", "choice": None}])
    with pytest.raises(DataError) as err:
        check_rows(df, "labels.csv", IDS)
    text = str(err.value)
    assert text.startswith("labels.csv: 4 row(s) refused, nothing imported")
    assert "row 2: choice 'maybe' is not one of a, b, tie, skip" in text
    assert "row 3: no choice" in text and "row 5: no choice" in text
    assert "row 4: id 'x-0009' is not from a collection" in text


def test_read_labelled_needs_id_and_choice_columns(tmp_path):
    path = tmp_path / "l.csv"
    path.write_text("id,prompt\nc-0000,hi\n")
    with pytest.raises(DataError, match="l.csv: no choice column"):
        read_labelled(path)
    path.write_text("id,choice,labeller\nc-0000, A ,ann\n")
    rows = check_rows(read_labelled(path), path, IDS)
    assert rows == [{"row": 1, "id": "c-0000", "choice": "a", "labeller": "ann"}]


def test_majority_vote_ties_on_even_split_and_agreement_rate():
    rows = [{"id": "p", "choice": c, "labeller": n} for c, n in
            (("a", "x"), ("a", "y"), ("b", "z"))]
    rows += [{"id": "q", "choice": c, "labeller": "x"} for c in ("a", "b", "skip")]
    rows += [{"id": "r", "choice": "skip", "labeller": "x"}]
    decided = majority(rows)
    assert decided["p"] == {"choice": "a", "votes": 3, "top": 2}
    assert decided["q"]["choice"] == "tie" and decided["r"]["choice"] == "skip"
    assert agreement_rate(decided) == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert agreement_rate(majority(rows[-1:])) is None


RECORDS = {"k1": {"prompt": "p", "response_a": "A", "response_b": "B", "known": "a"},
           "k2": {"prompt": "p", "response_a": "A", "response_b": "B", "known": "b"},
           "n1": {"prompt": "p", "response_a": "good", "response_b": "bad", "known": None,
                  "rm_a": 1.0, "rm_b": 0.0},
           "n2": {"prompt": "q", "response_a": "x", "response_b": "y", "known": None,
                  "rm_a": 0.0, "rm_b": 2.0},
           "n3": {"prompt": "q", "response_a": "u", "response_b": "v", "known": None,
                  "rm_a": 0.0, "rm_b": 1.0}}


RULES = LabelRules(min_known_agreement=0.6, min_known_labelled=1, max_skip_rate=0.5)


def test_figures_per_labeller_and_reward_model_agreement_and_known_pairs_never_train():
    votes = [("k1", "a", "ann"), ("k2", "b", "ann"), ("k1", "b", "bob"), ("k2", "a", "bob"),
             ("k1", "a", "cid"), ("n1", "a", "ann"), ("n2", "a", "ann"), ("n3", "tie", "ann")]
    rows = [{"id": i, "choice": c, "labeller": n} for i, c, n in votes]
    labellers = judge_labellers(rows, known_answers(RECORDS), RULES)
    assert {lab.name: lab.known_agreement for lab in labellers} == \
        {"ann": 1.0, "bob": 0.0, "cid": 1.0}
    kept = kept_rows(rows, labellers)  # bob held back: his votes are dropped
    assert {r["labeller"] for r in kept} == {"ann", "cid"}
    decided = majority(kept)
    figures = label_figures(rows, kept, decided, RECORDS, labellers)
    assert figures.held_back == {"bob": "agreement with the known answers 0.00 on 2 pairs "
                                        "is below 0.6"}
    assert figures.known_agreement == 1.0 and figures.known_labelled == 2
    assert figures.rm_agreement == 0.5 and figures.rm_pairs == 2
    metrics = figures.metrics()
    assert metrics["labels/known_agreement/bob"] == 0.0 and metrics["labels/held_back"] == 1
    pairs, counts = preference_rows(decided, RECORDS)
    assert pairs == [{"prompt": "p", "chosen": "good", "rejected": "bad"},
                     {"prompt": "q", "chosen": "x", "rejected": "y"}]
    assert counts == {"pairs": 2, "ties": 1, "skips": 0, "known": 2}


def _figures(**kw):
    base = {"known_agreement": 0.25, "known_labelled": 8, "rm_agreement": 0.3,
            "rm_pairs": 100, "agreement_rate": None, "kappa": None, "skip_rate": 0.1,
            "labellers": ()}
    return LabelFigures(**{**base, **kw})


def test_quality_refusal_names_the_figures():
    rules = LabelRules(0.6, 4, 0.5)
    text = quality_refusal(_figures(), rules, usual_rm=0.7, max_rm_drop=0.25)
    assert "known answers 0.25 on 8 pairs is below 0.6" in text
    assert "reward model 0.30 on 100 pairs is more than 0.25 below the usual 0.70" in text
    good = _figures(known_agreement=0.9)
    assert quality_refusal(good, rules, 0.5, 0.25) is None
    # too few known answers to judge: quarantined, not waved through
    few = quality_refusal(_figures(known_agreement=0.0, known_labelled=3), rules, None, 0.25)
    assert few == "not enough known answers: 3 known pairs answered a or b, fewer than 4"
    skippy = _figures(known_agreement=0.9, skip_rate=0.6)
    assert quality_refusal(skippy, rules, None, 0.25, usual_skip=None) is None
    assert "skip rate 0.60 is more than 0.25 above the usual 0.05" in \
        quality_refusal(skippy, rules, None, 0.25, usual_skip=0.05, max_skip_rise=0.25)
