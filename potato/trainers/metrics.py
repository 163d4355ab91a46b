"""Holdout scores, one function per kind of answer, the same on every backend and for every trainer.

Pure Python (part of the remote half: a trainer scores on the GPU host, the
server only stores what it reports). Each function takes the gold answers and
the predicted ones of a schema's held-out items, in the same order, and
returns the mapping that goes into ``scores.json`` under the schema; numbers
are rounded to 4 places, and a score with nothing to compute it on is None.
``describe`` words one schema's scores for the run log.
"""

from typing import Any, Dict, Optional, Sequence

def accuracy(gold: Sequence[str], predicted: Sequence[str]) -> Optional[float]:
    """The share of ``predicted`` equal to ``gold``; None when there is nothing to score."""
    if not gold:
        return None
    return sum(1 for g, p in zip(gold, predicted) if g == p) / len(gold)

def macro_f1(gold: Sequence[str], predicted: Sequence[str]) -> Optional[float]:
    """F1 averaged over the labels that occur in ``gold`` or ``predicted`` (as scikit-learn's
    ``f1_score(average="macro")``); a label never predicted and never true does not count."""
    if not gold:
        return None
    labels = sorted(set(gold) | set(predicted))
    total = 0.0
    for label in labels:
        tp = sum(1 for g, p in zip(gold, predicted) if g == label and p == label)
        fp = sum(1 for g, p in zip(gold, predicted) if g != label and p == label)
        fn = sum(1 for g, p in zip(gold, predicted) if g == label and p != label)
        total += 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)
    return total / len(labels)

def holdout_scores(gold: Sequence[str], predicted: Sequence[str]) -> Dict[str, Any]:
    """``{"accuracy", "macro_f1", "n"}`` for one schema's holdout items (rounded to 4 places)."""
    acc, f1 = accuracy(gold, predicted), macro_f1(gold, predicted)
    return {
        "accuracy": None if acc is None else round(acc, 4),
        "macro_f1": None if f1 is None else round(f1, 4),
        "n": len(gold),
    }


# What the run log, ``potato training runs``, the Training page and the Prefect table say for a
# schema none of whose labelled items was held out (``holdout_fraction: 0`` trains on every one).
NO_HOLDOUT = "no holdout scores"


def has_holdout(scores: Dict[str, Any]) -> bool:
    """Whether *scores* were computed on held-out items (``n`` above 0)."""
    n = scores.get("n")
    return not (isinstance(n, int) and n == 0)


def describe(schema: str, scores: Dict[str, Any]) -> str:
    """``Holdout sentiment: accuracy 0.950, macro-F1 0.949 (n=40)``: the run log's line for one schema."""
    if not has_holdout(scores):
        return "Holdout {}: {} (no labelled item was held out of training)".format(schema, NO_HOLDOUT)

    def number(key: str) -> str:
        value = scores.get(key)
        return "n/a" if value is None else "{:.3f}".format(value)

    return "Holdout {}: accuracy {}, macro-F1 {} (n={})".format(
        schema, number("accuracy"), number("macro_f1"), scores.get("n", 0))

