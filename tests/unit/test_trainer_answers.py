"""What trainers share about answers (potato/training/trainers/answers.py): reading the bundle's answers per kind,
a slider's range and step, multi-label thresholds, the prediction fields docs/answer-types.md gives."""

from __future__ import annotations

import pytest

from potato.training import answer_kinds
from potato.training.events import TrainerFailure
from potato.training.trainers import answers as a
from potato.training.trainers import hf_heads
from potato.training.trainers.registry import TRAINERS

SLIDER = {"type": "slider", "kind": "continuous", "min": 0, "max": 100, "step": 5}


def of(kind_spec: dict, labels=()):
    return a.SchemaAnswers.of({"schemas": {"s": list(labels)}, "answers": {"s": kind_spec}}, "s")


def test_a_bundle_without_answers_is_nominal():
    answers = a.SchemaAnswers.of({"schemas": {"s": ["x", "y"]}}, "s")
    assert (answers.kind, answers.labels, answers.describe()) == ("nominal", ["x", "y"], "labels x, y")


@pytest.mark.parametrize("spec, labels, value, gold", [
    ({"kind": "nominal"}, ["x", "y"], "y", "y"),
    ({"kind": "nominal"}, ["x", "y"], "z", None),                      # not a label of the schema
    ({"kind": "ordinal"}, ["1", "2", "3"], 2, "2"),                    # a likert point as a number
    ({"kind": "multilabel"}, ["a", "b", "c"], ["c", "a"], ("a", "c")),  # schema order
    ({"kind": "multilabel"}, ["a", "b", "c"], [], ()),                 # nothing ticked is an answer
    ({"kind": "multilabel"}, ["a", "b", "c"], ["a", "q"], None),
    ({"kind": "multilabel"}, ["a", "b", "c"], "a", None),
    (SLIDER, [], 37.5, 37.5),
    (SLIDER, [], "35", 35.0),                                          # as Potato 2.12 stores a slider
    (SLIDER, [], float("nan"), None),
    (SLIDER, [], True, None),
    (SLIDER, [], "far", None),
])
def test_gold_reads_each_kinds_answer_or_refuses_it(spec, labels, value, gold):
    assert of(spec, labels).gold(value) == gold


@pytest.mark.parametrize("spec, fraction, value", [
    (SLIDER, 0.372, 35),
    (SLIDER, 0.376, 40),
    (SLIDER, 1.7, 100),
    (SLIDER, -0.2, 0),
    ({"kind": "continuous", "min": 0, "max": 10, "step": 3}, 0.99, 9),      # 10 is not on the step
    ({"kind": "continuous", "min": 0.1, "max": 1.0, "step": 0.1}, 0.2223, 0.3),  # not 0.30000000000000004
    ({"kind": "continuous", "min": -1, "max": 1}, 0.62345678, 0.246914),
])
def test_snap_puts_a_value_inside_the_range_and_on_the_step(spec, fraction, value):
    snapped = of(spec).snap(fraction)
    assert snapped == value and type(snapped) is type(value)


def test_a_slider_without_a_range_takes_the_training_answers():
    answers = of({"kind": "continuous"})
    answers.fit_range([20.0, 80.0, 50.0])
    assert (answers.low, answers.high, answers.snap(0.5), answers.describe()) == (20.0, 80.0, 50, "values 20 to 80")
    assert of(SLIDER).describe() == "values 0 to 100 in steps of 5"


def test_thresholds_sit_between_the_items_and_stay_at_half_without_evidence():
    probs = [[0.9, 0.2], [0.8, 0.1], [0.35, 0.3], [0.3, 0.6], [0.1, 0.05], [0.05, 0.4], [0.2, 0.1]]
    truth = [[True, False], [True, False], [True, False], [False, False], [False, False], [False, False],
             [False, True]]
    # Label 0: its three positives are above every negative but 0.35 < 0.5; label 1: one positive only.
    assert a.tune_thresholds(probs, truth, 2) == [pytest.approx((0.3 + 0.35) / 2), 0.5]
    # The best F1 on a plateau: the middle of the widest run of equally good cuts.
    wide = [[0.9], [0.8], [0.7], [0.1], [0.05], [0.02]]
    assert a.tune_thresholds(wide, [[True]] * 3 + [[False]] * 3, 1) == [pytest.approx(0.4)]


def test_prediction_fields_follow_the_contract():
    labels = of({"kind": "multilabel"}, ["a", "b", "c"])
    # b is chosen at 0.45 (its threshold is 0.4): that decision, right with probability 0.45, is the least sure
    assert a.multilabel_fields(labels, [0.9, 0.45, 0.05], [0.5, 0.4, 0.5]) == {
        "label": ["a", "b"], "confidence": 0.45, "probs": [0.9, 0.45, 0.05]}
    scale = of({"kind": "ordinal"}, ["1", "2", "3", "4"])
    # Every item's probabilities, for the margin and entropy orders; a held-out item's whatever their number.
    assert a.label_fields(scale, [0.4, 0.0, 0.3, 0.3], False) == {
        "label": "1", "confidence": 0.4, "probs": [0.4, 0.0, 0.3, 0.3]}
    many = of({"kind": "nominal"}, [str(n) for n in range(33)])
    assert a.label_fields(many, [1 / 33] * 33, False) == {"label": "0", "confidence": round(1 / 33, 5)}
    assert len(a.label_fields(many, [1 / 33] * 33, True)["probs"]) == 33
    assert a.median_point([0.4, 0.0, 0.3, 0.3]) == 2
    assert a.label_fields(scale, [0.4, 0.0, 0.3, 0.3], True, 2) == {
        "label": "3", "confidence": 0.3, "probs": [0.4, 0.0, 0.3, 0.3]}


def test_a_schema_a_trainer_cannot_train_is_refused_before_anything_trains():
    manifest = {"schemas": {"s": [], "e": ["PER"]}, "answers": {"s": SLIDER, "e": {"type": "span", "kind": "span"}}}
    with pytest.raises(TrainerFailure) as failure:
        a.answers_of(manifest, ["s", "e"], "hf-text-classification", TRAINERS["hf-text-classification"].kinds)
    assert str(failure.value) == ("Schema 'e' has span answers, which hf-text-classification cannot train; it "
                                  "trains nominal, ordinal, continuous and multilabel schemas")
    with pytest.raises(TrainerFailure) as failure:
        a.answers_of(manifest, ["q"], "sklearn-text", TRAINERS["sklearn-text"].kinds)
    assert str(failure.value) == "Schema 'q' is not in the bundle; it has: s, e"
    assert list(a.answers_of(manifest, [], "hf-text-classification", ("continuous", "span"))) == ["s", "e"]


def test_hf_text_classification_has_a_head_for_each_kind_it_is_declared_to_train():
    assert tuple(hf_heads.HEADS) == TRAINERS["hf-text-classification"].kinds
    assert set(hf_heads.HEADS) <= set(answer_kinds.KINDS)


def test_an_ordinal_prediction_is_the_first_point_it_is_not_above():
    head = hf_heads.Ordinal(of({"kind": "ordinal"}, ["1", "2", "3", "4", "5"]))
    assert head.num_outputs == 4 and head.id2label() == {0: "above 1", 1: "above 2", 2: "above 3", 3: "above 4"}
    assert head.target("4") == [1.0, 1.0, 1.0, 0.0] and head.target("1") == [0.0, 0.0, 0.0, 0.0]
    record = head.record([0.9, 0.7, 0.2, 0.1], True)  # above 1 and 2, not above 3: "3"
    assert record == {"label": "3", "confidence": 0.5, "probs": [0.1, 0.2, 0.5, 0.1, 0.1]}
    # Outputs that disagree (above 3 more than above 2): no negative probability, and still the first point.
    record = head.record([0.9, 0.3, 0.6, 0.0], True)
    assert record == {"label": "2", "confidence": 0.46154, "probs": [0.07692, 0.46154, 0.0, 0.46154, 0.0]}
    assert head.answer([0.99, 0.99, 0.99, 0.99]) == "5" and head.answer([0.1, 0.1, 0.1, 0.1]) == "1"
    assert head.saved() == {"kind": "ordinal"}


def test_a_continuous_prediction_is_a_value_of_the_slider():
    head = hf_heads.Continuous(of(SLIDER))
    assert head.target(30) == 0.3 and head.record([0.4123], False) == {"value": 40}
    assert head.saved() == {"kind": "continuous", "min": 0.0, "max": 100.0, "step": 5.0}
