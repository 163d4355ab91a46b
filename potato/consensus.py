"""Dawid-Skene consensus: one label per item from several annotators, weighing each by reliability.

``model_training.aggregation: consensus`` (Potato 2.12's default) asks for it.
Majority vote gives a careless annotator the same say as a careful one;
Dawid-Skene estimates, by EM, each annotator's confusion matrix (how often they
say label l when the truth is j) and the class prior, and takes for each item
the label with the highest posterior. It is Potato 2.12.1's algorithm
(``potato/server_utils/consensus.py``: initialise from vote shares, M-step,
E-step, stop when the log-likelihood moves less than ``tol``), so a project
trained here gets the labels 2.12 would have trained on. Only the tie-break
differs: 2.12 breaks ties in the sorted order of the labels' JSON; here, like
majority vote, in the order the schema lists its labels.

Pure and dependency-free: items, annotators and labels are opaque hashables
and label indexes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Hashable, Iterable, Mapping, Sequence

MAX_ITERATIONS = 100
TOLERANCE = 1e-6


def dawid_skene(
    observations: Mapping[Hashable, Sequence[tuple[Hashable, int]]],
    *,
    max_iterations: int = MAX_ITERATIONS,
    tol: float = TOLERANCE,
) -> tuple[dict[Hashable, int], int]:
    """``({item: label index}, ties)`` from ``{item: [(annotator, label index), ...]}``.

    Label indexes are in the schema's order; only labels someone gave are
    classes. ``ties`` counts items whose best posterior is shared (the first
    label in schema order wins them).
    """
    items = [i for i, obs in observations.items() if obs]
    classes = sorted({label for i in items for _, label in observations[i]})
    if not classes:
        return {}, 0
    if len(classes) == 1:
        return {i: classes[0] for i in items}, 0
    k = len(classes)
    index = {label: n for n, label in enumerate(classes)}
    obs = {i: [(w, index[label]) for w, label in observations[i]] for i in items}
    workers = {w for i in items for w, _ in obs[i]}

    posterior: dict[Hashable, list[float]] = {}
    for i in items:
        counts = [0.0] * k
        for _, label in obs[i]:
            counts[label] += 1.0
        total = sum(counts)
        posterior[i] = [c / total for c in counts]

    previous = None
    for _ in range(max_iterations):
        prior, confusion = _m_step(items, obs, posterior, workers, k)
        likelihood = _e_step(items, obs, posterior, prior, confusion, k)
        if previous is not None and abs(likelihood - previous) < tol:
            break
        previous = likelihood

    labels, ties = {}, 0
    for i in items:
        best = max(posterior[i])
        winner = posterior[i].index(best)
        if sum(1 for p in posterior[i] if math.isclose(p, best, rel_tol=1e-12, abs_tol=1e-15)) > 1:
            ties += 1
        labels[i] = classes[winner]
    return labels, ties


def _m_step(items: Iterable, obs: Mapping, posterior: Mapping, workers: Iterable, k: int):
    """Class prior and each annotator's confusion matrix from the item posteriors."""
    prior = [0.0] * k
    for i in items:
        for j in range(k):
            prior[j] += posterior[i][j]
    total = sum(prior) or 1.0
    prior = [p / total for p in prior]
    num = defaultdict(lambda: [[0.0] * k for _ in range(k)])
    den = defaultdict(lambda: [0.0] * k)
    for i in items:
        for w, label in obs[i]:
            for j in range(k):
                num[w][j][label] += posterior[i][j]
                den[w][j] += posterior[i][j]
    confusion = {}
    for w in workers:
        # A true class this annotator never met: assume they say anything equally.
        confusion[w] = [
            [num[w][j][label] / den[w][j] for label in range(k)] if den[w][j] > 0 else [1.0 / k] * k
            for j in range(k)
        ]
    return prior, confusion


def _e_step(items: Iterable, obs: Mapping, posterior: dict, prior: Sequence[float],
            confusion: Mapping, k: int) -> float:
    """Update the item posteriors in place; return the log-likelihood."""
    likelihood = 0.0
    for i in items:
        scores = list(prior)
        for w, label in obs[i]:
            row = confusion[w]
            for j in range(k):
                scores[j] *= row[j][label]
        total = sum(scores)
        if total > 0:
            posterior[i] = [x / total for x in scores]
            likelihood += math.log(total)
        else:
            posterior[i] = [1.0 / k] * k
    return likelihood
