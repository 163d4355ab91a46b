"""Holdout metrics per kind of answer (potato/training/trainers/metrics.py), checked against scikit-learn and
SciPy where they compute the same thing, and the run log's line for each kind."""

from __future__ import annotations

import pytest

from potato.training import answer_kinds
from potato.training.trainers import metrics


def test_accuracy_and_macro_f1():
    gold = ["pos", "pos", "neg", "neg"]
    pred = ["pos", "neg", "neg", "neg"]
    assert metrics.accuracy(gold, pred) == 0.75
    # pos: P=1 R=.5 F1=2/3; neg: P=2/3 R=1 F1=.8 -> macro 0.7333
    assert metrics.macro_f1(gold, pred) == pytest.approx((2 / 3 + 0.8) / 2)
    assert metrics.holdout_scores(gold, pred) == {"kind": "nominal", "accuracy": 0.75, "macro_f1": 0.7333, "n": 4}
    assert metrics.holdout_scores([], []) == {"kind": "nominal", "accuracy": None, "macro_f1": None, "n": 0}
    # a label that is predicted but never true counts (with F1 0), as in scikit-learn
    assert metrics.macro_f1(["a", "a"], ["a", "b"]) == pytest.approx((2 / 3 + 0) / 2)
    assert metrics.macro_f1(["a", "b"], ["a", "b"]) == 1.0


SCALE = ["bad", "poor", "fair", "good", "great"]


def test_ordinal_scores_count_scale_steps_and_rank_agreement():
    stats = pytest.importorskip("scipy.stats")
    gold = ["bad", "poor", "fair", "good", "great", "great", "fair"]
    pred = ["bad", "fair", "fair", "great", "good", "great", "poor"]
    scores = metrics.holdout_scores(gold, pred, "ordinal", SCALE)
    positions = {label: i for i, label in enumerate(SCALE)}
    g, p = [positions[x] for x in gold], [positions[x] for x in pred]
    assert scores == {"kind": "ordinal", "n": 7, "accuracy": round(3 / 7, 4),
                      "mae": round(4 / 7, 4),  # four items one step off
                      "spearman": round(stats.spearmanr(g, p).statistic, 4)}


def test_continuous_scores_mae_in_the_answers_unit_and_spearman_with_ties():
    stats = pytest.importorskip("scipy.stats")
    gold = [10.0, 20.0, 20.0, 55.5, 90.0, 100.0]
    pred = [12, 25, 18, 50, 90, 90]
    scores = metrics.holdout_scores(gold, pred, "continuous")
    assert scores == {"kind": "continuous", "n": 6, "mae": round((2 + 5 + 2 + 5.5 + 0 + 10) / 6, 4),
                      "spearman": round(stats.spearmanr(gold, pred).statistic, 4)}
    assert metrics.spearman([1, 2, 3], [5, 5, 5]) is None  # constant: undefined, not 0
    assert metrics.holdout_scores([3.0], [4.0], "continuous") == {"kind": "continuous", "n": 1, "mae": 1.0,
                                                                  "spearman": None}


def test_multilabel_scores_match_scikit_learn():
    sk = pytest.importorskip("sklearn.metrics")
    labels = ["a", "b", "c", "d"]  # d: never true, never predicted; it does not count towards macro-F1
    gold = [["a"], ["a", "b"], [], ["c"], ["b", "c"]]
    pred = [["a"], ["a"], ["b"], ["c"], ["b", "c"]]
    scores = metrics.holdout_scores(gold, pred, "multilabel", labels)

    def matrix(sets):
        return [[1 if label in s else 0 for label in labels[:3]] for s in sets]

    assert scores == {
        "kind": "multilabel", "n": 5, "exact_match": 0.6,
        "micro_f1": round(sk.f1_score(matrix(gold), matrix(pred), average="micro"), 4),
        "macro_f1": round(sk.f1_score(matrix(gold), matrix(pred), average="macro"), 4),
    }
    # Nothing true or predicted anywhere: every set right, and no F1 to compute.
    assert metrics.holdout_scores([[], []], [[], []], "multilabel", labels) == {
        "kind": "multilabel", "n": 2, "exact_match": 1.0, "micro_f1": None, "macro_f1": None}


@pytest.mark.parametrize("scores, line", [
    ({"kind": "nominal", "n": 40, "accuracy": 0.95, "macro_f1": 0.9487},
     "Holdout s: accuracy 0.950, macro-F1 0.949 (n=40)"),
    ({"n": 40, "accuracy": 0.95, "macro_f1": None}, "Holdout s: accuracy 0.950, macro-F1 n/a (n=40)"),
    ({"kind": "ordinal", "n": 30, "accuracy": 0.6, "mae": 0.45, "spearman": 0.8123},
     "Holdout s: accuracy 0.600, MAE 0.450, Spearman's rho 0.812 (n=30)"),
    ({"kind": "continuous", "n": 30, "mae": 4.25, "spearman": 0.93},
     "Holdout s: MAE 4.250, Spearman's rho 0.930 (n=30)"),
    ({"kind": "multilabel", "n": 30, "exact_match": 0.9, "micro_f1": 0.95, "macro_f1": 0.94},
     "Holdout s: exact-set accuracy 0.900, micro-F1 0.950, macro-F1 0.940 (n=30)"),
    # A kind this version does not know (a newer agent's): every number it has.
    ({"kind": "novel", "n": 3, "f1": 0.5, "per_label": {"x": 1}}, "Holdout s: f1 0.500 (n=3)"),
])
def test_describe_words_each_kinds_metrics(scores, line):
    assert metrics.describe("s", scores) == line


def test_every_kind_scored_is_a_kind_of_answer():
    assert set(metrics.KINDS) <= set(answer_kinds.KINDS)


def test_scores_of_no_held_out_item_say_so_for_every_kind():
    ordinal = metrics.holdout_scores([], [], "ordinal", ["1", "2"])
    assert metrics.describe("rating", ordinal) == (
        "Holdout rating: no holdout scores (no labelled item was held out of training)")
