"""Holdout scores, one function per kind of answer, the same on every backend and for every trainer.

Pure Python (part of the remote half: a trainer scores on the GPU host, the
server only stores what it reports). Each function takes the gold answers and
the predicted ones of a schema's held-out items, in the same order, and
returns the mapping that goes into ``scores.json`` under the schema; numbers
are rounded to 4 places, and a score with nothing to compute it on is None.
``describe`` words one schema's scores for the run log.
"""

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

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


def span_scores(gold: Sequence[Iterable[Tuple[int, int, str]]],
                predicted: Sequence[Iterable[Tuple[int, int, str]]]) -> Dict[str, Any]:
    """Span-level precision, recall and F1 of one span schema's holdout items, by exact match.

    ``gold[k]`` and ``predicted[k]``: the ``(start, end, label)`` spans of the
    k-th item. A predicted span counts only when a gold span of its item has
    the same start, end and label — seqeval's definition (``mode="strict"``,
    IOB2; the CoNLL-2003 shared task's), here on character spans, so gold
    spans may overlap. Micro-averaged over all spans, and ``per_label`` (each
    label that is in the gold or the predictions, with its ``support``: the
    gold spans of that label). Precision is None without a predicted span,
    recall without a gold span, F1 without either (as seqeval's 0 with a
    warning); ``n`` counts the items.
    """
    # label -> [true positives, predicted, gold]
    counts: Dict[str, List[int]] = {}
    for gold_spans, predicted_spans in zip(gold, predicted):
        gold_set, predicted_set = set(gold_spans), set(predicted_spans)
        for span in predicted_set:
            count = counts.setdefault(span[2], [0, 0, 0])
            count[1] += 1
            count[0] += span in gold_set
        for span in gold_set:
            counts.setdefault(span[2], [0, 0, 0])[2] += 1

    def prf(tp: int, n_predicted: int, n_gold: int) -> Dict[str, Any]:
        return {"precision": None if not n_predicted else round(tp / n_predicted, 4),
                "recall": None if not n_gold else round(tp / n_gold, 4),
                "f1": None if not n_predicted + n_gold else round(2 * tp / (n_predicted + n_gold), 4)}

    total = [sum(c[k] for c in counts.values()) for k in range(3)]
    per_label = {label: dict(prf(*c), support=c[2]) for label, c in sorted(counts.items())}
    return dict(prf(*total), kind="span", per_label=per_label, n=len(gold))


def describe(schema: str, scores: Dict[str, Any]) -> str:
    """``Holdout sentiment: accuracy 0.950, macro-F1 0.949 (n=40)``: the run log's line for one schema
    (a span schema's: ``Holdout entities: span F1 0.912 (precision 0.930, recall 0.895); LOC 0.870; PER 0.950 (n=40)``)."""

    def number(key: str, of: Optional[Dict[str, Any]] = None) -> str:
        value = (scores if of is None else of).get(key)
        return "n/a" if value is None else "{:.3f}".format(value)

    if scores.get("kind") == "span":
        return "Holdout {}: span F1 {} (precision {}, recall {}){} (n={})".format(
            schema, number("f1"), number("precision"), number("recall"),
            "".join("; {} {}".format(label, number("f1", of)) for label, of in scores["per_label"].items()),
            scores.get("n", 0))
    return "Holdout {}: accuracy {}, macro-F1 {} (n={})".format(
        schema, number("accuracy"), number("macro_f1"), scores.get("n", 0))
