"""Holdout scores, one function per kind of answer, the same on every backend and for every trainer.

Pure Python (part of the remote half: a trainer scores on the GPU host, the
server only stores what it reports). A kind of answer (docs/answer-types.md)
is one scoring function plus one entry in ``KINDS``: the function takes the
gold answers and the predicted ones of a schema's held-out items, in the same
order, and the schema's labels; the entry names the metrics the run log
shows. :func:`holdout_scores` returns what goes into ``scores.json`` under the
schema (``kind``, ``n`` and the kind's metrics, rounded to 4 places; a score
with nothing to compute it on is None); :func:`describe` words it for the run
log.
"""

import math
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

Scores = Dict[str, Optional[float]]

# What the run log, ``potato training runs``, the Training page and the Prefect table say for a
# schema none of whose labelled items was held out (``holdout_fraction: 0`` trains on every one).
NO_HOLDOUT = "no holdout scores"


def has_holdout(scores: Dict[str, Any]) -> bool:
    """Whether *scores* were computed on held-out items (``n`` above 0)."""
    n = scores.get("n")
    return not (isinstance(n, int) and n == 0)


# -- the measures ------------------------------------------------------------------


def accuracy(gold: Sequence[Any], predicted: Sequence[Any]) -> Optional[float]:
    """The share of ``predicted`` equal to ``gold``; None when there is nothing to score."""
    if not gold:
        return None
    return sum(1 for g, p in zip(gold, predicted) if g == p) / len(gold)


def _f1(tp: int, fp: int, fn: int) -> float:
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


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
        total += _f1(tp, fp, fn)
    return total / len(labels)


def mean_absolute_error(gold: Sequence[float], predicted: Sequence[float]) -> Optional[float]:
    if not gold:
        return None
    return sum(abs(g - p) for g, p in zip(gold, predicted)) / len(gold)


def _ranks(values: Sequence[float]) -> List[float]:
    """Ranks from 1, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[order[k]] = (start + end) / 2.0 + 1
        start = end + 1
    return ranks


def spearman(gold: Sequence[float], predicted: Sequence[float]) -> Optional[float]:
    """Spearman's rank correlation (Pearson's of the tie-averaged ranks, as ``scipy.stats.spearmanr``);
    None for fewer than two items or when either side is constant (it is undefined then)."""
    if len(gold) < 2:
        return None
    x, y = _ranks(gold), _ranks(predicted)
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


# -- one function per kind ----------------------------------------------------------


def nominal(gold: Sequence[str], predicted: Sequence[str], labels: Sequence[str]) -> Scores:
    """One label per item: accuracy and macro-F1."""
    return {"accuracy": accuracy(gold, predicted), "macro_f1": macro_f1(gold, predicted)}


def ordinal(gold: Sequence[str], predicted: Sequence[str], labels: Sequence[str]) -> Scores:
    """A point of an ordered scale (``labels``, low to high): exact-match accuracy, and MAE and
    Spearman's rho over the points' positions, so an MAE of 1 is one step of the scale."""
    position = {label: i for i, label in enumerate(labels)}
    g, p = [position[x] for x in gold], [position[x] for x in predicted]
    return {"accuracy": accuracy(gold, predicted), "mae": mean_absolute_error(g, p), "spearman": spearman(g, p)}


def continuous(gold: Sequence[float], predicted: Sequence[float], labels: Sequence[str]) -> Scores:
    """A number: MAE (in the answer's own unit) and Spearman's rho."""
    return {"mae": mean_absolute_error(gold, predicted), "spearman": spearman(gold, predicted)}


def multilabel(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], labels: Sequence[str]) -> Scores:
    """A set of labels per item: exact-set accuracy, micro-F1 (over every label decision) and
    macro-F1 (per label, averaged over the labels that are true or predicted somewhere)."""
    if not gold:
        return {"exact_match": None, "micro_f1": None, "macro_f1": None}
    gold_sets, predicted_sets = [set(g) for g in gold], [set(p) for p in predicted]
    counts = {}  # type: Dict[str, List[int]]  # label -> [tp, fp, fn]
    for g, p in zip(gold_sets, predicted_sets):
        for label in g | p:
            c = counts.setdefault(label, [0, 0, 0])
            c[0 if label in g and label in p else 1 if label in p else 2] += 1
    tp, fp, fn = (sum(c[k] for c in counts.values()) for k in range(3))
    return {
        "exact_match": accuracy(gold_sets, predicted_sets),
        # No label true or predicted anywhere: F1 has nothing to count.
        "micro_f1": _f1(tp, fp, fn) if counts else None,
        "macro_f1": sum(_f1(*c) for c in counts.values()) / len(counts) if counts else None,
    }


class Kind(NamedTuple):
    score: Callable[[Sequence[Any], Sequence[Any], Sequence[str]], Scores]
    shown: Tuple[Tuple[str, str], ...]  # (key, how the run log names it), in the log's order


KINDS = {
    "nominal": Kind(nominal, (("accuracy", "accuracy"), ("macro_f1", "macro-F1"))),
    "ordinal": Kind(ordinal, (("accuracy", "accuracy"), ("mae", "MAE"), ("spearman", "Spearman's rho"))),
    "continuous": Kind(continuous, (("mae", "MAE"), ("spearman", "Spearman's rho"))),
    "multilabel": Kind(multilabel, (("exact_match", "exact-set accuracy"), ("micro_f1", "micro-F1"),
                                    ("macro_f1", "macro-F1"))),
}  # type: Dict[str, Kind]


def holdout_scores(gold: Sequence[Any], predicted: Sequence[Any], kind: str = "nominal",
                   labels: Sequence[str] = ()) -> Dict[str, Any]:
    """``{"kind", "n", ...the kind's metrics}`` for one schema's held-out items (rounded to 4 places)."""
    scores = {"kind": kind, "n": len(gold)}  # type: Dict[str, Any]
    for key, value in KINDS[kind].score(gold, predicted, labels).items():
        scores[key] = None if value is None else round(value, 4)
    return scores


def describe(schema: str, scores: Dict[str, Any]) -> str:
    """``Holdout sentiment: accuracy 0.950, macro-F1 0.949 (n=40)``: the run log's line for one schema.

    Each kind shows its own metrics (scores without ``kind`` are a nominal
    schema's); a kind this version does not know shows every number it has;
    scores of no held-out item say so.
    """
    def number(value: Any) -> str:
        return "{:.3f}".format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"

    if not has_holdout(scores):
        return "Holdout {}: {} (no labelled item was held out of training)".format(schema, NO_HOLDOUT)
    return "Holdout {}: {} (n={})".format(
        schema, ", ".join("{} {}".format(name, number(scores.get(key))) for key, name in _shown(scores)),
        scores.get("n", 0))


def _shown(scores: Dict[str, Any]) -> Tuple[Tuple[str, str], ...]:
    """(key, name) of the metrics a schema's scores show: its kind's, or for a kind this version does not
    know, every number it has."""
    kind = KINDS.get(scores.get("kind") or "nominal")
    if kind:
        return kind.shown
    return tuple((key, key) for key in sorted(scores)
                 if key not in ("kind", "n") and not isinstance(scores[key], (dict, list, str)))
