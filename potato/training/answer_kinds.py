"""Kinds of answer: what a schema's annotators give, as a trainer and a metric see it.

A schema's ``annotation_type`` decides its kind, as Potato 2.12 classifies
them (its ``SchemaKind``), so the two tools agree on which trainer fits which
schema. Trainers declare the kinds they train; the bundle carries each
schema's kind to the worker (docs/answer-types.md says what each kind's
answers, predictions, scores and writeback look like). A type that is not
here has kind ``unsupported``: nothing trains it.

Pure data (and the one rule both halves apply to a comparison's counts): no
I/O, importable anywhere.
"""

from __future__ import annotations

NOMINAL = "nominal"          # one label of several (radio, select)
ORDINAL = "ordinal"          # one point of an ordered scale (likert)
CONTINUOUS = "continuous"    # a number in a range (slider, number)
MULTILABEL = "multilabel"    # any set of labels (multiselect)
SPAN = "span"                # labelled character ranges of the item's text (span)
TEXT = "text"                # free text (text, textbox)
COMPARISON = "comparison"    # which of two responses is better, or neither (pairwise)
BEST_WORST = "best_worst"    # the best and the worst of a tuple of texts (bws)
RANKING = "ranking"          # an order of the schema's labels, best first (ranking)
UNSUPPORTED = "unsupported"

KINDS = (NOMINAL, ORDINAL, CONTINUOUS, MULTILABEL, SPAN, TEXT, COMPARISON, BEST_WORST, RANKING)
# The kinds Potato 2.12 pre-fills nothing for whatever the payload, whose items are in its data files: a prediction
# of one is written back as its confidence only, for model_review to order the items by
# (potato.prefill.writeback_shapes; potato.config allows them in writeback.schemas under model_review alone).
ORDER_ONLY_KINDS = (COMPARISON, RANKING)
# A best–worst answer: the position of the tuple's best text, and of its worst.
BEST, WORST = "best", "worst"

# A comparison's sides, as 2.12 stores a pairwise answer: the first response shown, the second, neither.
SIDES = ("A", "B")
TIE = "tie"


def majority_side(counts) -> str:
    """The side more annotators preferred in ``{"A": n, "B": n, "tie": n}``, or ``tie`` when as many chose each."""
    a, b = counts.get(SIDES[0], 0), counts.get(SIDES[1], 0)
    return SIDES[0] if a > b else SIDES[1] if b > a else TIE

def most_picked(counts) -> str:
    """The position most annotators picked in ``{"A": n, …}``, or ``tie`` when two share the most (or none)."""
    ranked = sorted(counts.items(), key=lambda pair: -pair[1])
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return TIE
    return ranked[0][0]


def mean_positions(orders, labels) -> list:
    """Each label's mean position (0 first) over the annotators' *orders*, in *labels*' order: the Borda
    count, a ranking's rank aggregation (the lower, the better)."""
    totals = dict.fromkeys(labels, 0)
    for order in orders:
        for position, label in enumerate(order):
            totals[label] += position
    return [totals[label] / len(orders) for label in labels]


def borda_order(orders, labels) -> tuple:
    """``(order, top)``: the labels by mean position over the annotators' *orders* (``mean_positions``; equal
    means keep the schema's order), and the first of them, or ``tie`` when another label's mean equals its."""
    means = mean_positions(orders, labels)
    ranked = sorted(range(len(labels)), key=lambda k: (means[k], k))
    top = TIE if len(ranked) > 1 and means[ranked[0]] == means[ranked[1]] else labels[ranked[0]]
    return [labels[k] for k in ranked], top


KIND_BY_TYPE = {
    "radio": NOMINAL,
    "select": NOMINAL,
    "likert": ORDINAL,
    "slider": CONTINUOUS,
    "number": CONTINUOUS,
    "multiselect": MULTILABEL,
    "span": SPAN,
    "text": TEXT,
    "textbox": TEXT,
    "pairwise": COMPARISON,
    "bws": BEST_WORST,
    "ranking": RANKING,
}


def kind_of_type(annotation_type: str) -> str:
    """The kind of answer a schema of ``annotation_type`` collects (``unsupported`` when none)."""
    return KIND_BY_TYPE.get((annotation_type or "").strip().lower(), UNSUPPORTED)
