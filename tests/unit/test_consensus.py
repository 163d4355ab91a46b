"""Dawid-Skene (potato.annotations.consensus): one annotator cannot capture items, and it learns who is reliable."""

from __future__ import annotations

import random

import pytest

from potato.annotations.consensus import dawid_skene, strict_majority


def _honest(truth: list[int], noise: float, rng: random.Random) -> list[int]:
    return [1 - t if rng.random() < noise else t for t in truth]


@pytest.mark.parametrize("targets", [1, 3, 5, 10])
def test_one_annotator_cannot_decide_items_of_their_choosing_against_two_honest_ones(targets):
    rng = random.Random(targets)
    truth = [rng.randrange(2) for _ in range(2000)]
    alice, bob = _honest(truth, 0.1, rng), _honest(truth, 0.1, rng)
    # The targeting annotator agrees with the truth everywhere except on items where both honest ones do too.
    chosen = [i for i in range(2000) if alice[i] == bob[i] == truth[i]][:targets]
    mallory = [1 - t if i in chosen else t for i, t in enumerate(truth)]
    observations = {i: [("alice", alice[i]), ("bob", bob[i]), ("mallory", mallory[i])] for i in range(2000)}
    labels, _ = dawid_skene(observations)
    assert [labels[i] for i in chosen] == [truth[i] for i in chosen]


def test_where_two_disagree_the_more_reliable_annotator_wins():
    # Three annotators, each item answered by two of them in turn: what the careful one says on
    # the items it shares with each careless one tells the model who to believe where two disagree.
    rng = random.Random(7)
    truth = [rng.randrange(2) for _ in range(900)]
    said = {"careful": _honest(truth, 0.02, rng), "careless": _honest(truth, 0.35, rng),
            "hasty": _honest(truth, 0.35, rng)}
    pairs = [("careful", "careless"), ("careful", "hasty"), ("careless", "hasty")]
    observations = {i: [(who, said[who][i]) for who in pairs[i % 3]] for i in range(900)}
    labels, _ = dawid_skene(observations)
    disputed = [i for i in range(900) if i % 3 < 2 and len({said[who][i] for who in pairs[i % 3]}) == 2]
    assert len(disputed) > 150 and all(labels[i] == said["careful"][i] for i in disputed)


def test_a_strict_majority_needs_two_agreeing_annotators_and_more_than_half():
    assert strict_majority((("a", 0), ("b", 0), ("c", 1))) == 0
    assert strict_majority((("a", 0), ("b", 1))) is None
    assert strict_majority((("a", 0),)) is None
    assert strict_majority((("a", 0), ("b", 1), ("c", 2))) is None
    assert strict_majority((("a", 0), ("a", 1), ("b", 1))) == 1  # multiselect: a ticked both


def test_identical_observations_get_identical_labels_and_ties_are_counted():
    labels, ties = dawid_skene({"x": [("a", 1), ("b", 0)], "y": [("b", 0), ("a", 1)]})
    assert labels == {"x": 0, "y": 0} and ties == 2  # nothing tells a from b: a tie, to the first label
