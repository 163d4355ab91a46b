"""A learning curve: would more labels help? The same schema trained on nested shares of its labels.

With ``curve: true`` (a trainer option; ``potato training run --curve``), a
schema's model is trained again on 25, 50 and 75 % of its training items —
nested, each share holding the one before, drawn once with the run's seed —
and each is scored on the same held-out items as the whole run, so the four
points differ only in how many labels trained them (Prodigy's
``train-curve`` does the same). Each share trains no more epochs than the
whole run actually trained (its early stop included) and predicts only the
held-out items, so its training steps are at most 1.5 times the run's, plus
each share's validation and holdout passes: measured on SST-2 with 200
labels (40 held out, 3 000 unlabelled) the curve added 1.8 times the run's
training time, with 500 labels 1.5 times.

The verdict reads the last quarter of the labels: a main metric that still
rises by ``RISING`` points or more from 75 to 100 % says more labels should
help; one that moved less over the last half is flat.

Part of the remote half: standard library only, Python 3.8.
"""

import random
from typing import Any, Dict, List, Optional, Sequence

SHARES = (0.25, 0.5, 0.75)
# Points (hundredths of the metric) the last quarter must add for "still rising".
RISING = 1.0
FLAT = 0.5


def nested_shares(positions: Sequence[int], seed: int) -> Dict[float, List[int]]:
    """Each of ``SHARES`` of ``positions``: nested (each share holds the smaller ones), in their order."""
    order = list(positions)
    random.Random(seed).shuffle(order)
    shares = {}  # type: Dict[float, List[int]]
    for share in SHARES:
        chosen = set(order[:max(1, int(round(share * len(order))))])
        shares[share] = [i for i in positions if i in chosen]
    return shares


def point(share: float, items: int, scores: Dict[str, Any], key: str) -> Dict[str, Any]:
    """One point of the curve as ``scores.json`` keeps it: the share, its training items, its main metric."""
    return {"share": share, "items": items, key: scores.get(key)}


def verdict(curve: Sequence[Dict[str, Any]], key: str, name: str, higher_is_better: bool) -> Optional[str]:
    """The curve in words, from its last points (None with fewer than three scored points):
    ``still rising: +2.4 points of accuracy over the last quarter of the labels; more labels should help``."""
    values = [p.get(key) for p in curve if isinstance(p.get(key), (int, float)) and not isinstance(p.get(key), bool)]
    if len(values) < 3:
        return None
    # A share (accuracy, F1) moves in points; an error (MAE) in its own unit, and falls as the model improves.
    points = higher_is_better and all(0 <= v <= 1 for v in values)
    scale = 100.0 if points else 1.0
    sign = 1.0 if higher_is_better else -1.0
    last = sign * (values[-1] - values[-2]) * scale
    half = sign * (values[-1] - values[-3]) * scale
    step = RISING if points else RISING / 100

    def change(gain: float) -> str:
        if points:
            return "{:+.1f} points of {}".format(gain, name)
        rose = (gain > 0) == higher_is_better  # an error that improves goes down
        return "{} {} {:.3f}".format(name, "up" if rose else "down", abs(gain))

    if last >= step:
        return "still rising: {} over the last quarter of the labels; more labels should help".format(change(last))
    if abs(half) < (FLAT if points else FLAT / 100):
        return "flat over the last half of the labels ({}); more labels like these may not help".format(change(half))
    if last <= -step:
        return ("falling over the last quarter of the labels ({}): the newest labels may disagree with the "
                "others".format(change(last)))
    return "levelling off: {} over the last quarter of the labels".format(change(last))
