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
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from potato.training.answer_kinds import TIE, borda_order, majority_side, mean_positions, most_picked

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


Span = Tuple[int, int, str]  # (start, end, label): characters of the item's text, end exclusive


def span(gold: Sequence[Iterable[Span]], predicted: Sequence[Iterable[Span]], labels: Sequence[str]) -> Dict[str, Any]:
    """Labelled character ranges: span-level precision, recall and F1 by exact match, and per label.

    ``gold[k]`` and ``predicted[k]``: the ``(start, end, label)`` spans of the
    k-th item. A predicted span counts only when a gold span of its item has
    the same start, end and label — seqeval's definition (``mode="strict"``,
    IOB2; the CoNLL-2003 shared task's), here on character spans, so gold
    spans may overlap. Micro-averaged over all spans, and ``per_label`` (each
    label that is in the gold or the predictions, with its ``support``: the
    gold spans of that label; rounded here, as it is no number). Precision is
    None without a predicted span, recall without a gold span, F1 without
    either (as seqeval's 0 with a warning).
    """
    counts = {}  # type: Dict[str, List[int]]  # label -> [true positives, predicted, gold]
    for gold_spans, predicted_spans in zip(gold, predicted):
        gold_set, predicted_set = set(gold_spans), set(predicted_spans)
        for one in predicted_set:
            count = counts.setdefault(one[2], [0, 0, 0])
            count[1] += 1
            count[0] += one in gold_set
        for one in gold_set:
            counts.setdefault(one[2], [0, 0, 0])[2] += 1

    def prf(tp: int, n_predicted: int, n_gold: int) -> Dict[str, Any]:
        return {"precision": None if not n_predicted else tp / n_predicted,
                "recall": None if not n_gold else tp / n_gold,
                "f1": None if not n_predicted + n_gold else 2 * tp / (n_predicted + n_gold)}

    total = [sum(c[k] for c in counts.values()) for k in range(3)]
    per_label = {label: dict(_rounded(prf(*c)), support=c[2]) for label, c in sorted(counts.items())}
    return dict(prf(*total), per_label=per_label)


# -- free text -------------------------------------------------------------------------


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
    streams = [[answers[k] if k < len(answers) else None for answers in gold]
               for k in range(most)]  # type: List[List[Optional[str]]]
    return float(CHRF().corpus_score(list(predicted), streams).score)


def text(gold: Sequence[Sequence[str]], predicted: Sequence[str], labels: Sequence[str] = ()) -> Dict[str, Any]:
    """Free text (each item's gold: every annotator's answer): exact match and chrF."""
    return {"exact_match": exact_match(gold, predicted), "chrf": chrf(gold, predicted)}


# -- each kind's line in the run log ---------------------------------------------------


def comparison(gold: Sequence[Dict[str, int]], predicted: Sequence[str], labels: Sequence[str] = ()) -> Dict[str, Any]:
    """A comparison schema's holdout: ``agreement``, the share of items with a majority (not a tie) where the
    model prefers the majority's side; ``annotator_agreement``, the share of the annotators' choices of a
    side that the model's matches (a tie, preferring neither, is neither matched nor missed); ``decided``,
    the items with a majority."""
    decided = [(majority_side(g), p) for g, p in zip(gold, predicted) if majority_side(g) != TIE]
    chose = sum(g.get("A", 0) + g.get("B", 0) for g in gold)
    matched = sum(g.get(p, 0) for g, p in zip(gold, predicted))
    return {"agreement": sum(side == p for side, p in decided) / len(decided) if decided else None,
            "annotator_agreement": matched / chose if chose else None, "decided": len(decided)}


def best_worst(gold: Sequence[Dict[str, Dict[str, int]]], predicted: Sequence[Tuple[str, str]],
               labels: Sequence[str] = ()) -> Dict[str, Any]:
    """A best–worst schema's holdout, each tuple's prediction its ``(best, worst)`` positions:
    ``best_agreement`` (``worst_agreement``), the share of tuples whose most-picked best (worst) is shared by
    no other position where the model's is it; ``agreement``, their mean; ``annotator_agreement``, the share
    of the annotators' picks, best and worst alike, that the model's matched; ``decided``, the tuples with a
    most-picked best."""
    shares = []
    for k, role in enumerate(("best", "worst")):
        decided = [(most_picked(g.get(role, {})), p[k]) for g, p in zip(gold, predicted)]
        decided = [(said, p) for said, p in decided if said != TIE]
        shares.append(sum(said == p for said, p in decided) / len(decided) if decided else None)
    picks = sum(sum(g.get(role, {}).values()) for g in gold for role in ("best", "worst"))
    matched = sum(g.get("best", {}).get(p[0], 0) + g.get("worst", {}).get(p[1], 0) for g, p in zip(gold, predicted))
    known = [share for share in shares if share is not None]
    return {"agreement": sum(known) / len(known) if known else None, "best_agreement": shares[0],
            "worst_agreement": shares[1], "annotator_agreement": matched / picks if picks else None,
            "decided": sum(1 for g in gold if most_picked(g.get("best", {})) != TIE)}


def kendall_tau(gold: Sequence[float], predicted: Sequence[float]) -> Optional[float]:
    """Kendall's tau-b (ties on either side counted as ``scipy.stats.kendalltau`` counts them); None when either
    side is constant."""
    concordant = discordant = tied_gold = tied_predicted = 0
    for i in range(len(gold)):
        for j in range(i + 1, len(gold)):
            g, p = gold[i] - gold[j], predicted[i] - predicted[j]
            if g == 0 and p == 0:
                continue
            if g == 0:
                tied_gold += 1
            elif p == 0:
                tied_predicted += 1
            elif (g > 0) == (p > 0):
                concordant += 1
            else:
                discordant += 1
    scale = math.sqrt((concordant + discordant + tied_gold) * (concordant + discordant + tied_predicted))
    return (concordant - discordant) / scale if scale and concordant + discordant else None


def pairs_kept(orders: Sequence[Sequence[str]], order: Sequence[str]) -> Tuple[int, int]:
    """``(kept, implied)``: of the pairs the annotators' *orders* imply (each label above each one below it),
    those the predicted *order* puts the same way round, and how many there are."""
    at = {label: k for k, label in enumerate(order)}
    kept = implied = 0
    for said in orders:
        for i in range(len(said)):
            for j in range(i + 1, len(said)):
                implied += 1
                kept += at[said[i]] < at[said[j]]
    return kept, implied


def ranking(gold: Sequence[List[List[str]]], predicted: Sequence[Sequence[str]],
            labels: Sequence[str] = ()) -> Dict[str, Any]:
    """A ranking schema's holdout, each item's gold its annotators' orders and its prediction an order:
    ``agreement``, the share of the pairs the annotators' orders imply (each label above each one below it)
    that the predicted order puts the same way round; ``kendall_tau`` and ``spearman``, the mean over items of
    each coefficient between the predicted order and the annotators' Borda count (each label's mean position);
    ``top_agreement``, the share of items whose Borda count puts one label first where the prediction puts it
    first; ``decided``, those items."""
    pairs = matched = 0
    taus, rhos, tops = [], [], []
    for orders, order in zip(gold, predicted):
        at = {label: k for k, label in enumerate(order)}
        kept, implied = pairs_kept(orders, order)
        matched, pairs = matched + kept, pairs + implied
        means = mean_positions(orders, labels)
        mine = [float(at[label]) for label in labels]
        for found, into in ((kendall_tau(means, mine), taus), (spearman(means, mine), rhos)):
            if found is not None:
                into.append(found)
        top = borda_order(orders, labels)[1]
        if top != TIE:
            tops.append(order[0] == top)
    return {"agreement": matched / pairs if pairs else None,
            "kendall_tau": sum(taus) / len(taus) if taus else None,
            "spearman": sum(rhos) / len(rhos) if rhos else None,
            "top_agreement": sum(tops) / len(tops) if tops else None, "decided": len(tops)}


def _number(value: Any) -> str:
    return "{:.3f}".format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"


def _listed(*shown: Tuple[str, str]) -> Callable[[Dict[str, Any]], str]:
    """Words for scores that list ``(key, how the run log names it)`` in this order."""
    return lambda scores: ", ".join("{} {}".format(name, _number(scores.get(key))) for key, name in shown)


def _comparison_words(scores: Dict[str, Any]) -> str:
    """``agreement with the majority 0.950, with each annotator 0.839`` and, after DPO, ``(the base model: 0.517)``."""
    words = _listed(("agreement", "agreement with the majority"), ("annotator_agreement", "with each annotator"))(scores)
    before = scores.get("agreement_before")
    return words + (" (the base model: {})".format(_number(before)) if before is not None else "")


def _span_words(scores: Dict[str, Any]) -> str:
    """``span F1 0.912 (precision 0.930, recall 0.895); LOC 0.870; PER 0.950``."""
    per_label = scores.get("per_label")
    return "span F1 {} (precision {}, recall {}){}".format(
        _number(scores.get("f1")), _number(scores.get("precision")), _number(scores.get("recall")),
        "".join("; {} {}".format(label, _number(of.get("f1")))
                for label, of in (per_label.items() if isinstance(per_label, dict) else ()) if isinstance(of, dict)))


class Main(NamedTuple):
    """The one number a kind's model is judged by (choosing its epoch, comparing two runs)."""

    key: str              # in the kind's scores
    name: str             # as the run log names it
    higher_is_better: bool

    def of(self, scores: Dict[str, Any]) -> Optional[float]:
        value = scores.get(self.key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def better_is_higher(self, value: float) -> float:
        """``value`` as a number where higher is better (an error's negative)."""
        return value if self.higher_is_better else -value


class Kind(NamedTuple):
    score: Callable[[Sequence[Any], Sequence[Any], Sequence[str]], Dict[str, Any]]
    words: Callable[[Dict[str, Any]], str]  # the kind's metrics as the run log words them
    main: Main


KINDS = {
    "nominal": Kind(nominal, _listed(("accuracy", "accuracy"), ("macro_f1", "macro-F1")),
                    Main("accuracy", "accuracy", True)),
    "ordinal": Kind(ordinal, _listed(("accuracy", "accuracy"), ("mae", "MAE"), ("spearman", "Spearman's rho")),
                    Main("mae", "MAE", False)),
    "continuous": Kind(continuous, _listed(("mae", "MAE"), ("spearman", "Spearman's rho")),
                       Main("mae", "MAE", False)),
    "multilabel": Kind(multilabel, _listed(("exact_match", "exact-set accuracy"), ("micro_f1", "micro-F1"),
                                           ("macro_f1", "macro-F1")),
                       Main("micro_f1", "micro-F1", True)),
    "span": Kind(span, _span_words, Main("f1", "span F1", True)),
    "text": Kind(text, _listed(("exact_match", "exact match"), ("chrf", "chrF")), Main("chrf", "chrF", True)),
    "comparison": Kind(comparison, _comparison_words, Main("agreement", "agreement", True)),
    "best_worst": Kind(best_worst, _listed(("best_agreement", "best agreement with the majority"),
                                           ("worst_agreement", "worst"), ("annotator_agreement", "with each annotator")),
                       Main("agreement", "agreement", True)),
    "ranking": Kind(ranking, _listed(("agreement", "pairwise agreement with each annotator"),
                                     ("kendall_tau", "Kendall's tau with the Borda count"),
                                     ("spearman", "Spearman's rho"), ("top_agreement", "first place")),
                    Main("agreement", "pairwise agreement", True)),
}  # type: Dict[str, Kind]


def _rounded(scores: Dict[str, Any]) -> Dict[str, Any]:
    return {key: round(value, 4) if isinstance(value, float) else value for key, value in scores.items()}


def holdout_scores(gold: Sequence[Any], predicted: Sequence[Any], kind: str = "nominal",
                   labels: Sequence[str] = ()) -> Dict[str, Any]:
    """``{"kind", "n", ...the kind's metrics}`` for one schema's held-out items (rounded to 4 places)."""
    scores = {"kind": kind, "n": len(gold)}  # type: Dict[str, Any]
    scores.update(_rounded(KINDS[kind].score(gold, predicted, labels)))
    return scores


def describe(schema: str, scores: Dict[str, Any]) -> str:
    """``Holdout sentiment: accuracy 0.950, macro-F1 0.949 (n=40)``: the run log's line for one schema.

    Each kind words its own metrics (scores without ``kind`` are a nominal
    schema's; a span schema's: ``Holdout entities: span F1 0.912 (precision
    0.930, recall 0.895); LOC 0.870; PER 0.950 (n=40)``); a kind this version
    does not know shows every number it has; scores of no held-out item say so.
    """
    if not has_holdout(scores):
        return "Holdout {}: {} (no labelled item was held out of training)".format(schema, NO_HOLDOUT)
    kind = KINDS.get(scores.get("kind") or "nominal")
    words = kind.words if kind else _listed(*((key, key) for key in sorted(scores) if key not in ("kind", "n")
                                              and not isinstance(scores[key], (dict, list, str))))
    return "Holdout {}: {} (n={})".format(schema, words(scores), scores.get("n", 0))
