"""How unsure a model is of one prediction, per ordering strategy and kind of answer.

Under ``assignment_strategy: model_review`` Potato 2.12 serves the items a
run predicted in an order (``potato.prefill.review_order`` carries it there); each
strategy but ``least-confidence`` ranks items by a number computed here from
the prediction's own fields (``confidence``, ``probs``, a span's
``confidence``), from 0 (sure) to 1 (as unsure as it can be), so that the
schemas of one item can be compared:

==================  ==========================================================
strategy            one schema's number
==================  ==========================================================
least-confidence    ``1 - p1`` scaled to 0..1 (Potato 2.12's own order: the
                    item's lowest ``confidence``; no priority is written)
margin              ``1 - (p1 - p2)``: the gap between the two likeliest
                    labels (Schröder et al. 2022: the best uncertainty
                    strategy with transformers); the default
entropy             the entropy of the labels' probabilities, over its
                    largest (``ln n``)
diverse             the margin's most uncertain items (``POOL_FACTOR`` × the
                    batch), clustered by k-means over the model's own
                    embeddings into a batch's worth of clusters, the most
                    uncertain of each first (``potato.training.trainers.diversity``,
                    in the worker), the rest by margin
==================  ==========================================================

Per kind: **nominal** and **ordinal** (a likert's points) use the labels'
probabilities (every prediction line carries ``probs`` up to
``MAX_PROBS_LABELS`` labels; beyond that, or from an older worker, the
confidence alone bounds them: margin ≥ ``2 p1 - 1``, entropy ≤ that of ``p1``
with the rest spread evenly). **multilabel**: each label is a yes/no
decision; margin is the least certain label's ``|2p - 1|``, entropy the mean
of the labels' binary entropies, least-confidence the prediction's
``confidence`` (its least certain decision, thresholds included). **span**
and **text**: the least confident span (or the text's confidence) as a
yes/no decision; none without confidences. **continuous**: a regression
gives no uncertainty, so such a schema does not rank items (the diverse
strategy still spreads them). An item's number is its most uncertain
schema's (as Potato 2.12 takes an item's lowest confidence over its schemas).

Part of the remote half (the worker picks the diverse strategy's candidates
with the same numbers): Python 3.8, standard library only.
"""

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence

from potato.training.answer_kinds import (
    BEST_WORST,
    COMPARISON,
    CONTINUOUS,
    MULTILABEL,
    NOMINAL,
    ORDINAL,
    RANKING,
    SPAN,
    TEXT,
)

LEAST_CONFIDENCE = "least-confidence"
MARGIN = "margin"
ENTROPY = "entropy"
DIVERSE = "diverse"
STRATEGIES = (LEAST_CONFIDENCE, MARGIN, ENTROPY, DIVERSE)
DEFAULT_STRATEGY = MARGIN
# The number the diverse strategy picks its candidates by.
BASE_OF = {LEAST_CONFIDENCE: LEAST_CONFIDENCE, MARGIN: MARGIN, ENTROPY: ENTROPY, DIVERSE: MARGIN}

# A prediction line carries every label's probability up to this many labels (8 bytes each): margin and
# entropy need them, and a line of a 2-label schema grows by 26 bytes. Beyond it the confidence bounds them.
MAX_PROBS_LABELS = 32
# The diverse strategy spreads this many times a batch of the most uncertain items over the embedding space
# (Citovsky et al. 2021 draw from 10x; 5x keeps the extra prediction pass of the worker under a few seconds).
POOL_FACTOR = 5
# The batch the diverse strategy spreads, when the config names none (auto_retrain's update_frequency does).
DEFAULT_BATCH = 50
MAX_BATCH = 10000


def _h(p: float) -> float:
    return -p * math.log(p) if p > 0 else 0.0


def _binary(strategy: str, certainty: float) -> float:
    """One yes/no decision's number, from the probability of the side it took (0.5..1)."""
    c = min(max(certainty, 0.5), 1.0)
    if strategy == MARGIN:
        return 1.0 - (2 * c - 1)
    if strategy == ENTROPY:
        return (_h(c) + _h(1 - c)) / math.log(2)
    return (1.0 - c) / 0.5


def of_probs(strategy: str, probs: Sequence[float]) -> float:
    """One label's number among several, from every label's probability."""
    n = len(probs)
    if n < 2:
        return 0.0
    ranked = sorted(probs, reverse=True)
    if strategy == MARGIN:
        return min(max(1.0 - (ranked[0] - ranked[1]), 0.0), 1.0)
    if strategy == ENTROPY:
        total = sum(probs) or 1.0
        return min(sum(_h(p / total) for p in probs) / math.log(n), 1.0)
    return min(max((1.0 - ranked[0]) / (1.0 - 1.0 / n), 0.0), 1.0)


def of_confidence(strategy: str, confidence: float, n_labels: int) -> float:
    """One label's number among *n_labels*, from the chosen one's probability alone (the bounds above)."""
    c = min(max(confidence, 0.0), 1.0)
    if n_labels < 2:
        return 0.0
    if strategy == MARGIN:
        return 1.0 - max(0.0, 2 * c - 1)
    if strategy == ENTROPY:
        rest = (1.0 - c) / (n_labels - 1)
        return min((_h(c) + (n_labels - 1) * _h(rest)) / math.log(n_labels), 1.0)
    return min(max((1.0 - c) / (1.0 - 1.0 / n_labels), 0.0), 1.0)


def schema_uncertainty(strategy: str, kind: str, confidence: Optional[float], probs: Optional[Sequence[float]],
                       n_labels: int, spans: Optional[Sequence[Dict[str, Any]]] = None) -> Optional[float]:
    """One prediction's number (0 sure .. 1 unsure) under *strategy*, or None when it says nothing."""
    base = BASE_OF[strategy]
    # a comparison: the sides' probabilities; a tuple: each position's of being the best; a ranking: of being first
    if kind in (NOMINAL, ORDINAL, COMPARISON, BEST_WORST, RANKING):
        if probs is not None and len(probs) == n_labels:
            return of_probs(base, probs)
        return of_confidence(base, confidence, n_labels) if confidence is not None else None
    if kind == MULTILABEL:
        if base == LEAST_CONFIDENCE or not probs:
            return _binary(LEAST_CONFIDENCE, confidence) if confidence is not None else None
        per_label = [_binary(base, max(p, 1.0 - p)) for p in probs]
        return max(per_label) if base == MARGIN else sum(per_label) / len(per_label)
    if kind == SPAN:
        known = [s["confidence"] for s in spans or () if s.get("confidence") is not None]
        return _binary(base, min(known)) if known else None
    if kind in (TEXT, CONTINUOUS):
        return _binary(base, confidence) if confidence is not None else None
    return None


def item_uncertainty(numbers: Iterable[Optional[float]]) -> Optional[float]:
    """An item's number: its most uncertain schema's (None when none of its schemas says anything)."""
    known = [n for n in numbers if n is not None]
    return max(known) if known else None


def check_order(spec: Any) -> Optional[str]:
    """What is wrong with job.json's ``order`` (``{"strategy", "batch"}``; absent: no order), or None."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        return "order is {!r}; expected an object {{\"strategy\", \"batch\"}}".format(str(spec)[:200])
    strategy = spec.get("strategy")
    if strategy not in STRATEGIES:
        return "order.strategy is {!r}; expected one of {}".format(str(strategy)[:200], ", ".join(STRATEGIES))
    batch = spec.get("batch", DEFAULT_BATCH)
    if not (isinstance(batch, int) and not isinstance(batch, bool) and 1 <= batch <= MAX_BATCH):
        return "order.batch is {!r}; expected a whole number from 1 to {}".format(str(batch)[:200], MAX_BATCH)
    return None


def candidates(numbers: Sequence[Optional[float]], ids: Sequence[str], count: int) -> List[int]:
    """The positions of the *count* most uncertain items (ties by id), most uncertain first; items whose
    number is None come last, by id."""
    order = sorted(range(len(ids)), key=lambda i: (numbers[i] is None, -(numbers[i] or 0.0), ids[i]))
    return order[:count]
