"""Confidence calibration, measured and fitted in pure Python (stdlib only, Python >= 3.8).

Everything here works on the *top label*: each prediction is its predicted
label's confidence ``c`` and whether that label was right. That is what the
writeback's ``min_confidence`` filters on, what an annotator sees, and what
the reliability diagram draws; and it is all a prediction without its full
probability vector (an item not held out) has. A calibration map changes
``c`` to ``sigmoid(a * logit(c) + b)`` and never the label:

- **temperature** (``b = 0``, ``a = 1/T``): one parameter. For a two-label
  schema it is exactly softmax temperature scaling; for more labels it is its
  top-label form. Over-confidence gives ``T > 1``.
- **Platt** (``a`` and ``b``): two parameters, fitted to Platt's smoothed
  targets ``(N+ + 1) / (N+ + 2)`` and ``1 / (N- + 2)`` instead of 1 and 0 —
  his remedy for small calibration sets, where a perfectly separated handful
  of items would otherwise drive the map to certainty. Used on small
  holdouts (``SMALL_HOLDOUT``).

Whether a map helps is judged out of fold: each holdout item's calibrated
confidence comes from a map fitted on the *other* folds, so a map that merely
memorised its own few items shows up as worse, which is how a tiny holdout
backs out. (Potato 2.12's ``calibration.py`` tells the story of calibrating
fourteen examples into uselessness; its check is training accuracy, ours
held-out log-loss and expected calibration error.)

Log-loss is of the gold label. The calibrated probability of a label other
than the predicted one is its share of the remaining mass, so only the top
label's term depends on the map; without a record's full probabilities that
remaining mass is spread evenly over the other labels.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

# Below this many held-out items a schema is calibrated with Platt's method.
SMALL_HOLDOUT = 200
# Below this many, nothing is fitted: there is too little to judge a map by.
MIN_HOLDOUT = 10
# Fits look at no more than this many items (every k-th), so a 200 k-item holdout
# takes seconds, not minutes; the metrics use every item.
MAX_FIT_ITEMS = 20000
_EPS = 1e-6


def _clip(p: float) -> float:
    return min(max(p, _EPS), 1.0 - _EPS)


def logit(p: float) -> float:
    p = _clip(p)
    return math.log(p / (1.0 - p))


def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


class CalibrationMap(object):
    """``c -> sigmoid(a * logit(c) + b)``; the identity is ``a=1, b=0``."""

    def __init__(self, a: float = 1.0, b: float = 0.0, method: str = "none"):
        self.a, self.b, self.method = a, b, method

    def __call__(self, confidence: float) -> float:
        if self.a == 1.0 and self.b == 0.0:
            return confidence
        return sigmoid(self.a * logit(confidence) + self.b)

    @property
    def temperature(self) -> Optional[float]:
        return 1.0 / self.a if self.b == 0.0 and self.a > 0 else None

    def as_dict(self) -> Dict[str, object]:
        out = {"method": self.method, "a": round(self.a, 6), "b": round(self.b, 6)}  # type: Dict[str, object]
        if self.temperature is not None:
            out["temperature"] = round(self.temperature, 6)
        return out


def with_top(probs: Sequence[float], confidence: float) -> List[float]:
    """``probs`` with the top label's probability set to ``confidence`` and the other labels sharing the
    rest in their old proportions (as they are, when the top label had it all)."""
    top = max(range(len(probs)), key=probs.__getitem__)
    raw = probs[top]
    if raw >= 1.0:
        return [confidence if k == top else p for k, p in enumerate(probs)]
    return [confidence if k == top else p * (1.0 - confidence) / (1.0 - raw) for k, p in enumerate(probs)]


# -- measures --------------------------------------------------------------------


def reliability_bins(confidences: Sequence[float], correct: Sequence[bool], bins: int = 10) -> List[Dict[str, float]]:
    """Equal-width confidence bins: ``{"lo", "hi", "n", "confidence", "accuracy"}`` (means; empty bins kept, n 0)."""
    n = [0] * bins
    conf = [0.0] * bins
    right = [0] * bins
    for c, ok in zip(confidences, correct):
        k = min(int(c * bins), bins - 1)
        n[k] += 1
        conf[k] += c
        right[k] += 1 if ok else 0
    return [
        {"lo": round(k / bins, 4), "hi": round((k + 1) / bins, 4), "n": n[k],
         "confidence": round(conf[k] / n[k], 4) if n[k] else None,
         "accuracy": round(right[k] / n[k], 4) if n[k] else None}
        for k in range(bins)
    ]


def expected_calibration_error(confidences: Sequence[float], correct: Sequence[bool], bins: int = 10) -> Optional[float]:
    """Sum over bins of (items in bin / all) * |accuracy - mean confidence|; None without items."""
    total = len(confidences)
    if not total:
        return None
    error = 0.0
    for b in reliability_bins(confidences, correct, bins):
        if b["n"]:
            error += b["n"] / total * abs(b["accuracy"] - b["confidence"])
    return error


def gold_probability(confidence: float, correct: bool, raw_confidence: float, raw_gold: Optional[float],
                     n_labels: int) -> float:
    """The calibrated probability of the gold label (module docstring)."""
    if correct:
        return confidence
    rest = 1.0 - confidence
    if raw_gold is None or raw_confidence >= 1.0:
        return rest / max(n_labels - 1, 1)
    return raw_gold * rest / (1.0 - raw_confidence)


def log_loss(confidences: Sequence[float], correct: Sequence[bool], raw_confidences: Sequence[float],
             raw_gold: Sequence[Optional[float]], n_labels: int) -> Optional[float]:
    """Mean ``-log p(gold)`` over the items; None without items."""
    if not confidences:
        return None
    total = 0.0
    for c, ok, rc, rg in zip(confidences, correct, raw_confidences, raw_gold):
        total -= math.log(_clip(gold_probability(c, ok, rc, rg, n_labels)))
    return total / len(confidences)


def threshold_for_precision(confidences: Sequence[float], correct: Sequence[bool],
                            target: float = 0.9) -> Tuple[Optional[float], float]:
    """``(lowest confidence t whose items at or above t are right >= target of the time, their share)``.

    ``(None, 0.0)`` when no threshold reaches *target*.
    """
    ranked = sorted(zip(confidences, correct), key=lambda pair: -pair[0])
    best = None  # type: Optional[Tuple[float, float]]
    right = 0
    for i, (c, ok) in enumerate(ranked, 1):
        right += 1 if ok else 0
        # Only where the next item's confidence differs can a threshold fall.
        if (i == len(ranked) or ranked[i][0] < c) and right / i >= target:
            best = (c, i / len(ranked))
    return best if best is not None else (None, 0.0)


# -- fitting ---------------------------------------------------------------------


def _thin(z: Sequence[float], y: Sequence[float]) -> Tuple[Sequence[float], Sequence[float]]:
    if len(z) <= MAX_FIT_ITEMS:
        return z, y
    step = int(math.ceil(len(z) / float(MAX_FIT_ITEMS)))
    return z[::step], y[::step]


def _newton(z: Sequence[float], t: Sequence[float], with_bias: bool) -> Tuple[float, float]:
    """Minimise the cross-entropy of ``sigmoid(a*z + b)`` against targets *t* (Newton, backtracking)."""
    a, b = 1.0, 0.0

    def loss(a: float, b: float) -> float:
        total = 0.0
        for zi, ti in zip(z, t):
            s = a * zi + b
            # log(1 + e^s) - t*s, computed without overflow
            total += (s if s > 0 else 0.0) + math.log1p(math.exp(-abs(s))) - ti * s
        return total

    current = loss(a, b)
    for _ in range(50):
        ga = gb = haa = hab = hbb = 0.0
        for zi, ti in zip(z, t):
            p = sigmoid(a * zi + b)
            d = p - ti
            w = p * (1.0 - p)
            ga += d * zi
            gb += d
            haa += w * zi * zi
            hab += w * zi
            hbb += w
        haa += 1e-9
        hbb += 1e-9
        if with_bias:
            det = haa * hbb - hab * hab
            if det <= 0:
                break
            da = (hbb * ga - hab * gb) / det
            db = (haa * gb - hab * ga) / det
        else:
            da, db = ga / haa, 0.0
        step = 1.0
        while step > 1e-8:
            na, nb = a - step * da, b - step * db
            candidate = loss(na, nb)
            if candidate <= current:
                break
            step /= 2
        else:
            break
        converged = abs(current - candidate) < 1e-10 * max(1.0, abs(current))
        a, b, current = na, nb, candidate
        if converged:
            break
    return a, b


def fit(confidences: Sequence[float], correct: Sequence[bool], method: str) -> CalibrationMap:
    """Fit a ``"temperature"`` or ``"platt"`` map to top-label confidences and outcomes."""
    z = [logit(c) for c in confidences]
    if method == "platt":
        positives = sum(1 for ok in correct if ok)
        negatives = len(correct) - positives
        hi, lo = (positives + 1.0) / (positives + 2.0), 1.0 / (negatives + 2.0)
        zs, ts = _thin(z, [hi if ok else lo for ok in correct])
        a, b = _newton(zs, ts, with_bias=True)
        return CalibrationMap(a, b, "platt")
    zs, ts = _thin(z, [1.0 if ok else 0.0 for ok in correct])
    a, _ = _newton(zs, ts, with_bias=False)
    a = min(max(a, 0.05), 20.0)  # T from 0.05 to 20: a holdout the model gets all right must not make it certain
    return CalibrationMap(a, 0.0, "temperature")


def choose_method(n: int, method: str = "auto") -> str:
    if method != "auto":
        return method
    return "platt" if n < SMALL_HOLDOUT else "temperature"


def out_of_fold(confidences: Sequence[float], correct: Sequence[bool], method: str, folds: int = 5) -> List[float]:
    """Each item's calibrated confidence under a map fitted without its fold (folds by position, k-th item to fold k % folds)."""
    folds = max(2, min(folds, len(confidences)))
    out = [0.0] * len(confidences)
    for f in range(folds):
        train = [i for i in range(len(confidences)) if i % folds != f]
        mapping = fit([confidences[i] for i in train], [correct[i] for i in train], method)
        for i in range(f, len(confidences), folds):
            out[i] = mapping(confidences[i])
    return out
