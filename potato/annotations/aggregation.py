"""One answer per item and schema from several annotators' answers, per kind of answer.

Each rule, and why (the choices were measured by ``bench/answer_aggregation.py``
on simulated annotators; docs/answer-types.md has the table):

- **nominal** — the label with most votes (ties: the first in the schema's
  order), or Dawid–Skene with ``aggregation: consensus`` (``potato.annotations.labels``).
- **ordinal** — the median point of the annotators' answers (with an even
  number of annotators and two middle points, the lower one; counted as a
  tie). A likert's points are ordered, and the median uses that: three
  annotators answering 2, 3 and 5 agree on 3, where a vote count would see
  three different labels and fall back to the first point. Simulated (5
  points, 3 annotators, answers off by a point 30 % of the time): median
  83.4 % exact against 76.8 % for the most-voted point, MAE 0.17 against
  0.28. ``consensus`` does not change it: Dawid–Skene treats points as
  unordered labels.
- **continuous** — the median of the annotators' numbers (of the two middle
  ones, their mean). It ignores a careless answer — a slider saved at its
  starting value — where the mean follows it: with 10 % careless answers,
  MAE 5.06 against 5.97 for the mean (the mean wins, 3.61 to 4.30, only when
  no one is careless).
- **multilabel** — per label, on when at least half of the item's annotators
  ticked it. The item's annotators are those who saved it (``potato.annotations.annotator_answers``):
  ticking no box is saying "none of these". Annotators miss labels more
  often than they add wrong ones, so at exactly half the label stays on: with
  two annotators, exact-set accuracy 66.9 % against 64.2 % for a strict
  majority, with four 93.4 % against 84.0 % (labels at exactly half are
  counted as ties). With ``consensus``, Dawid–Skene per label, each label a
  yes/no question.
- **span** — character-level majority: each character of the text gets the
  label that at least half of the item's annotators covered it with (the
  first in schema order if two do), and runs of one label are the spans.
  Annotators agree on what a span is more often than on its exact ends;
  span-level voting throws away a span when one boundary differs. Simulated
  exact-match F1 with 3 annotators: 0.917 against 0.894 for span voting
  (5 annotators: 0.958 against 0.931; with only 2, span voting is ahead,
  0.855 to 0.829). ``consensus`` does not apply.
- **text** — every annotator's answer is kept, each a training example.
- **comparison** — how many annotators preferred each response and how many
  neither, ``{"A": 2, "B": 1, "tie": 0}``: the counts, not a majority alone,
  so a reward model learns how sure the annotators were (a 2–1 split is a
  weaker preference than 3–0) and the holdout can count agreement with each
  annotator as well as with the majority (the side more annotators chose;
  equal counts are a tie, counted in ``ties``).
- **best_worst** — how many annotators picked each position of a tuple as
  its best and as its worst, ``{"best": {"A": 2, "C": 1}, "worst": {"D": 3}}``
  (counts, as for a comparison; the items whose most-picked best is shared by
  two positions are counted in ``ties``).
- **ranking** — every annotator's order of the labels, best first,
  ``[["B", "A", "C"], ["B", "C", "A"]]``: each order implies a pair for every
  label above another, and those pairs are what the model learns; the
  holdout compares each annotator's order as well as their Borda count (each
  label's mean position; the items whose first place two labels share are
  counted in ``ties``).

Pure: votes (``potato.annotations.labels``) and answers (``potato.annotations.annotator_answers``) in, answers out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from potato.annotations.annotator_answers import AnnotatorAnswers
from potato.annotations.labels import Votes, aggregate_votes, changed_labels, consensus_votes, unpack_counts
from potato.config import Scheme
from potato.training.answer_kinds import (
    BEST,
    BEST_WORST,
    COMPARISON,
    CONTINUOUS,
    MULTILABEL,
    NOMINAL,
    ORDINAL,
    RANKING,
    SIDES,
    SPAN,
    TEXT,
    TIE,
    WORST,
    borda_order,
)


class Coded(NamedTuple):
    """A schema's answers as small codes: ``per_item[id]`` in ``range(radix)``, ``decode(code)`` its JSON value.

    The bundle writes items in bulk by these codes (``potato.bundle.build``): a few
    distinct answers, each serialised once, shared by 500 k items.
    """

    per_item: dict[str, int]
    radix: int
    decode: Callable[[int], Any]


@dataclass
class Aggregated:
    """One answer per item: ``coded`` schemas (nominal, ordinal, multilabel, continuous), ``rich`` ones
    (span: ``[(start, end, label)]`` on 2.12's rendered text; text: every answer), and ties per schema."""

    coded: dict[str, Coded] = field(default_factory=dict)
    rich: dict[str, dict[str, Any]] = field(default_factory=dict)
    ties: dict[str, int] = field(default_factory=dict)
    # With consensus: per nominal schema, the items Dawid-Skene labelled otherwise than majority vote.
    changed_by_consensus: dict[str, int] | None = None


def aggregate(votes: Votes, answers: AnnotatorAnswers | None, schemes: Sequence[Scheme], consensus: bool) -> Aggregated:
    """Every schema's one answer per item, by its kind's rule (module docstring)."""
    out = Aggregated()
    by_kind: dict[str, list[Scheme]] = {}
    for scheme in schemes:
        by_kind.setdefault(scheme.kind, []).append(scheme)
    if by_kind.get(NOMINAL):
        part = _subset(votes, by_kind[NOMINAL])
        labels = consensus_votes(part) if consensus else aggregate_votes(part)
        if consensus:
            out.changed_by_consensus = changed_labels(labels, aggregate_votes(part))
        for scheme in by_kind[NOMINAL]:
            names = labels.schemes[scheme.name]
            out.coded[scheme.name] = Coded(labels.labels[scheme.name], len(names), names.__getitem__)
            out.ties[scheme.name] = labels.ties[scheme.name]
    for scheme in by_kind.get(ORDINAL, ()):
        per_item, out.ties[scheme.name] = median_points(votes.votes[scheme.name], len(scheme.labels))
        out.coded[scheme.name] = Coded(per_item, len(scheme.labels), scheme.labels.__getitem__)
    answered = answers.answered if answers is not None else {}
    for scheme in by_kind.get(MULTILABEL, ()):
        if consensus and len(votes.by_user) >= 2 and answers is not None:
            masks, ties = consensus_label_sets(votes, answers, scheme)
        else:
            masks, ties = majority_label_sets(votes.votes[scheme.name], answered, len(scheme.labels))
        out.coded[scheme.name] = Coded(masks, 1 << len(scheme.labels), _set_decoder(scheme.labels))
        out.ties[scheme.name] = ties
    for scheme in by_kind.get(CONTINUOUS, ()):
        medians = {item: _median(values) for item, values in answers.values[scheme.name].items()}
        distinct = sorted(set(medians.values()))
        index = {value: i for i, value in enumerate(distinct)}
        out.coded[scheme.name] = Coded({item: index[m] for item, m in medians.items()}, len(distinct),
                                       distinct.__getitem__)
        out.ties[scheme.name] = 0
    for scheme in by_kind.get(SPAN, ()):
        spans = answers.spans[scheme.name]
        order = {label: i for i, label in enumerate(scheme.labels)}
        out.rich[scheme.name] = {item: majority_spans(spans.get(item, ()), count, order)
                                 for item, count in answered.items()}
        out.ties[scheme.name] = 0
    for scheme in by_kind.get(TEXT, ()):
        out.rich[scheme.name] = dict(answers.values[scheme.name])
        out.ties[scheme.name] = 0
    for scheme in by_kind.get(COMPARISON, ()):
        out.coded[scheme.name], out.ties[scheme.name] = comparison_counts(answers.choices[scheme.name])
    for scheme in by_kind.get(BEST_WORST, ()):
        out.coded[scheme.name], out.ties[scheme.name] = best_worst_counts(answers.picks[scheme.name], scheme.labels)
    for scheme in by_kind.get(RANKING, ()):
        out.coded[scheme.name], out.ties[scheme.name] = ranking_orders(answers.orders[scheme.name], scheme.labels)
    return out


def comparison_counts(choices: Mapping[str, Sequence[str]]) -> tuple[Coded, int]:
    """Each item's ``{"A": n, "B": n, "tie": n}`` as codes, and how many items' majorities are ties."""
    counted = {item: (said.count(SIDES[0]), said.count(SIDES[1]), said.count(TIE)) for item, said in choices.items()}
    distinct = sorted(set(counted.values()))
    index = {counts: i for i, counts in enumerate(distinct)}
    answers = [dict(zip((*SIDES, TIE), counts)) for counts in distinct]
    ties = sum(1 for a, b, _ in counted.values() if a == b)
    return Coded({item: index[c] for item, c in counted.items()}, len(distinct), answers.__getitem__), ties


def best_worst_counts(picks: Mapping[str, Sequence[tuple[str | None, str | None]]],
                      positions: Sequence[str]) -> tuple[Coded, int]:
    """Each tuple's ``{"best": {position: n}, "worst": {position: n}}`` as codes (positions in order, none
    picked left out), and how many tuples' most-picked best is shared."""
    def counts(said: Sequence[str | None]) -> tuple[int, ...]:
        return tuple(said.count(p) for p in positions)

    counted = {item: (counts([b for b, _ in said]), counts([w for _, w in said])) for item, said in picks.items()}
    distinct = sorted(set(counted.values()))
    index = {c: i for i, c in enumerate(distinct)}
    answers = [{BEST: {p: n for p, n in zip(positions, best) if n},
                WORST: {p: n for p, n in zip(positions, worst) if n}} for best, worst in distinct]
    ties = sum(1 for best, _ in counted.values() if sorted(best)[-2:].count(max(best)) == 2)
    return Coded({item: index[c] for item, c in counted.items()}, len(distinct), answers.__getitem__), ties


def ranking_orders(orders: Mapping[str, Sequence[tuple[str, ...]]], labels: Sequence[str]) -> tuple[Coded, int]:
    """Each item's annotators' orders (sorted, so the same orders are one code) as codes, and how many items'
    Borda count puts two labels first."""
    counted = {item: tuple(sorted(said)) for item, said in orders.items()}
    distinct = sorted(set(counted.values()))
    index = {c: i for i, c in enumerate(distinct)}
    answers = [[list(order) for order in said] for said in distinct]
    ties = sum(1 for said in counted.values() if borda_order(said, labels)[1] == TIE)
    return Coded({item: index[c] for item, c in counted.items()}, len(distinct), answers.__getitem__), ties


def _subset(votes: Votes, schemes: Iterable[Scheme]) -> Votes:
    names = [s.name for s in schemes]
    return Votes(schemes={n: votes.schemes[n] for n in names}, votes={n: votes.votes[n] for n in names},
                 users=votes.users, by_user={u: {n: per.get(n, {}) for n in names} for u, per in votes.by_user.items()})


def _median(values: Sequence[float]) -> float:
    middle = statistics.median(values)
    return int(middle) if float(middle).is_integer() else float(middle)


def median_points(per_item: Mapping[str, int], n_points: int) -> tuple[dict[str, int], int]:
    """``({item: the median point's index}, ties)`` from packed vote counts (``potato.annotations.labels``).

    Two middle points (an even count of answers that split): the lower, and a tie.
    Each distinct count is decided once.
    """
    decided: dict[int, tuple[int, bool]] = {}
    for packed in set(per_item.values()):
        counts = unpack_counts(packed, n_points)
        total = sum(counts)
        low = _nth_point(counts, (total - 1) // 2)
        decided[packed] = (low, _nth_point(counts, total // 2) != low)
    ties = sum(1 for packed in per_item.values() if decided[packed][1])
    return {item: decided[packed][0] for item, packed in per_item.items()}, ties


def _nth_point(counts: Sequence[int], n: int) -> int:
    """The point of the *n*-th answer (from 0) in order of points."""
    seen = 0
    for point, count in enumerate(counts):
        seen += count
        if n < seen:
            return point
    return len(counts) - 1


def majority_label_sets(per_item: Mapping[str, int], answered: Mapping[str, int],
                        n_labels: int) -> tuple[dict[str, int], int]:
    """``({item: bitmask of the labels at least half its annotators ticked}, ties)``.

    Every item someone answered gets a set (maybe empty). A label at exactly
    half is on, and counts one tie.
    """
    decided: dict[tuple[int, int], tuple[int, int]] = {}
    masks: dict[str, int] = {}
    ties = 0
    for item in set(answered) | set(per_item):
        packed = per_item.get(item, 0)
        counts = unpack_counts(packed, n_labels)
        key = (packed, max(answered.get(item, 0), max(counts, default=0), 1))
        if key not in decided:
            n = key[1]
            mask = sum(1 << i for i, c in enumerate(counts) if c and 2 * c >= n)
            decided[key] = (mask, sum(1 for c in counts if c and 2 * c == n))
        masks[item], tied = decided[key]
        ties += tied
    return masks, ties


def consensus_label_sets(votes: Votes, answers: AnnotatorAnswers, scheme: Scheme) -> tuple[dict[str, int], int]:
    """Dawid–Skene per label: each label a yes/no question to every annotator who saved the item."""
    from potato.annotations.consensus import dawid_skene

    n_labels = len(scheme.labels)
    ticked = {user: {item: unpack_counts(packed, n_labels)
                     for item, packed in per_schema.get(scheme.name, {}).items()}
              for user, per_schema in votes.by_user.items()}
    masks = {item: 0 for items in answers.answered_by.values() for item in items}
    ties = 0
    for label in range(n_labels):
        observations: dict[str, list[tuple[str, int]]] = {}
        for user, items in answers.answered_by.items():
            mine = ticked.get(user, {})
            for item in items:
                observations.setdefault(item, []).append((user, 1 if mine.get(item, (0,) * n_labels)[label] else 0))
        decided, tied = dawid_skene(observations)
        ties += tied
        for item, value in decided.items():
            if value:
                masks[item] |= 1 << label
    return masks, ties


def _set_decoder(labels: Sequence[str]) -> Callable[[int], list[str]]:
    def decode(mask: int) -> list[str]:
        return [label for i, label in enumerate(labels) if mask >> i & 1]
    return decode


def majority_spans(spans: Iterable[tuple[str, int, int, str]], annotators: int,
                   order: Mapping[str, int]) -> list[tuple[int, int, str]]:
    """Character-level majority of one item's spans ``(user, start, end, label)`` among *annotators*.

    Each annotator counts once per character and label (their overlapping
    spans of one label are merged); a character takes the first label, in
    schema order, that at least half of the annotators gave it.
    """
    mine: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for user, start, end, label in spans:
        mine.setdefault((user, label), []).append((start, end))
    events: dict[int, dict[str, int]] = {}
    for (_, label), ranges in mine.items():
        for start, end in _merged(ranges):
            events.setdefault(start, {}).setdefault(label, 0)
            events[start][label] += 1
            events.setdefault(end, {}).setdefault(label, 0)
            events[end][label] -= 1
    n = max(annotators, len({user for user, _ in mine}), 1)
    covering: dict[str, int] = {}
    out: list[list[Any]] = []
    bounds = sorted(events)
    for here, there in zip(bounds, bounds[1:]):
        for label, change in events[here].items():
            covering[label] = covering.get(label, 0) + change
        chosen = min((label for label, c in covering.items() if c and 2 * c >= n), key=order.__getitem__,
                     default=None)
        if chosen is None:
            continue
        if out and out[-1][1] == here and out[-1][2] == chosen:
            out[-1][1] = there
        else:
            out.append([here, there, chosen])
    return [(start, end, label) for start, end, label in out]


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]
