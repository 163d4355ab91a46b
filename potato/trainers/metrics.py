"""Holdout scores, one function per kind of answer, the same on every backend and for every trainer.

Pure Python (part of the remote half: a trainer scores on the GPU host, the
server only stores what it reports). Each function takes the gold answers and
the predicted ones of a schema's held-out items, in the same order, and
returns the mapping that goes into ``scores.json`` under the schema; numbers
are rounded to 4 places, and a score with nothing to compute it on is None.
``describe`` words one schema's scores for the run log.
"""

from typing import Any, Dict, List, Optional, Sequence

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

def holdout_scores(gold: Sequence[Any], predicted: Sequence[Any], kind: str = "nominal",
                   labels: Sequence[str] = ()) -> Dict[str, Any]:
    """The metrics of ``kind`` for one schema's holdout items (rounded to 4 places), with ``"n"``;
    a kind other than nominal also says its ``"kind"``."""
    if kind == "text":
        scores = dict(text(gold, predicted, labels), kind=kind)  # type: Dict[str, Any]
    elif kind == "multilabel":
        scores = {"kind": kind, "exact_match": accuracy([sorted(g) for g in gold], [sorted(p) for p in predicted])}
    else:
        scores = {"accuracy": accuracy(gold, predicted), "macro_f1": macro_f1(gold, predicted)}
        if kind != "nominal":
            scores["kind"] = kind
    for key, value in scores.items():
        if isinstance(value, float):
            scores[key] = round(value, 4)
    scores["n"] = len(gold)
    return scores


# -- text answers ----------------------------------------------------------------------------


def _normal_text(text: str) -> str:
    return " ".join(text.split())


def exact_match(gold: Sequence[Sequence[str]], predicted: Sequence[str]) -> Optional[float]:
    """The share of ``predicted`` texts equal to one of their item's ``gold`` answers (every annotator's
    answer counts), whitespace collapsed, case kept; None when there is nothing to score."""
    if not gold:
        return None
    return sum(1 for answers, p in zip(gold, predicted)
               if _normal_text(p) in {_normal_text(a) for a in answers}) / len(gold)


def chrf(gold: Sequence[Sequence[str]], predicted: Sequence[str]) -> Optional[float]:
    """Corpus chrF (0-100) of ``predicted`` against each item's ``gold`` answers, as sacrebleu computes it:
    character n-gram F-score (n up to 6, recall weighted twice), each item against its best-matching answer."""
    if not gold:
        return None
    from sacrebleu.metrics import CHRF

    most = max(len(answers) for answers in gold)
    # Items with fewer answers than the most have None in the streams they lack (sacrebleu skips those).
    streams: List[List[Optional[str]]] = [[answers[k] if k < len(answers) else None for answers in gold]
                                          for k in range(most)]
    return float(CHRF().corpus_score(list(predicted), streams).score)


def text(gold: Sequence[Sequence[str]], predicted: Sequence[str], labels: Sequence[str] = ()) -> Dict[str, Any]:
    """Free text (each item's gold: every annotator's answer): exact match and chrF."""
    return {"exact_match": exact_match(gold, predicted), "chrf": chrf(gold, predicted)}


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

    if scores.get("kind") == "text":
        return "Holdout {}: exact match {}, chrF {} (n={})".format(
            schema, number("exact_match"), number("chrf"), scores.get("n", 0))
    return "Holdout {}: accuracy {}, macro-F1 {} (n={})".format(
        schema, number("accuracy"), number("macro_f1"), scores.get("n", 0))


def table_row(schema: str, scores: Dict[str, Any]) -> Dict[str, Any]:
    """One row of the Prefect table of a run's scores; ``NO_HOLDOUT`` in place of numbers nobody computed."""
    if not has_holdout(scores):
        return {"schema": schema, "accuracy": NO_HOLDOUT, "macro_f1": NO_HOLDOUT, "n": 0}
    row = {"schema": schema}
    row.update(scores)
    return row
