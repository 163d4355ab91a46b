"""The order Potato 2.12 serves items in under ``model_review``, carried in the payloads without misstating a confidence.

Potato 2.12.1's ``model_review`` (its ``item_state_management._model_review_candidates``
and ``model_review.review_order``) serves the un-annotated items whose data
holds a non-empty payload under ``pre_annotation.field``, for a configured
schema, lowest first by the *minimum*, over the item's payloads, of the first
of ``confidence``/``score``/``probability``/``prob`` it finds in each mapping
at any depth (ties by item id); items whose payloads hold no number come
after those that do, and items with no payload are never served. Left alone
that is ``least-confidence``. The other strategies
(``potato.training.trainers.uncertainty``: ``margin``, the default, ``entropy``,
``diverse``) rank the items themselves and carry the rank in one mapping of
one payload per item, named for what it is::

    {"sentiment": {"label": "positive", "confidence": 0.93, "run_id": 7,
                   "review_order": {"by": "margin", "rank": 12, "score": 0.000412}}}

``confidence`` stays the model's own; ``review_order.score`` is the number
2.12's minimum finds. For the item ranked ``k`` of ``n`` it is
``cap_k × k / (n + 1)``, where ``cap_k`` is the lowest confidence of the
items ranked ``k`` and after and of every item the order does not rank (1
where there is none): strictly rising with the rank, and never above any
confidence of its item, so 2.12's minimum is the score and 2.12 serves the
ranked items first, in rank order, then the others least confident first.

Where the mapping goes, per item (``mark``): into this run's schemas first,
in ``writeback.schemas`` order, then any other: a mapping payload (radio,
select, likert, number, a confidence only) takes it as a key; a list of
mappings (multiselect, spans) in its first entry; a bare number or string
(slider, text) has no room and is passed over. An item with no payload that
has room (a slider-only item, the empty set of a multiselect, cold start)
gets a payload of its own, ``{"review_order": {…}, "run_id": 7}``, in its
first schema whose type pre-fills nothing from a mapping
(``writeback_shapes.CONFIDENCE_ONLY_TYPES``); a project with none of those
(slider or text schemas only) cannot be ordered, and 2.12 serves its items
as they come (the run log says how many). The run's own record
(``written-back.jsonl``) keeps the payloads without their place: a later
writeback or a retract orders afresh, and takes every earlier place away.

Pure: no I/O.
"""

from __future__ import annotations

import math
from array import array
from typing import Any, Dict, Iterable, Iterator, Mapping, Sequence, Tuple

from potato.config import MODEL_REVIEW, ProjectConfig, Scheme, assignment_strategy
from potato.prefill.prediction_shapes import Prediction
from potato.prefill.writeback_shapes import CONFIDENCE_ONLY_TYPES, payload_confidences
from potato.training.trainers.uncertainty import (
    DEFAULT_BATCH,
    LEAST_CONFIDENCE,
    item_uncertainty,
    schema_uncertainty,
)

ORDER_KEY = "review_order"
# One record to write: (index, id, predictions with their place, run ids, predictions as the run record keeps them).
Placed = Tuple[int, str, Dict[str, Any], Dict[str, int], Dict[str, Any]]
COLD_START = "cold-start"  # who ranked the items of a run of order lines only (potato.training.trainers.cold_start)


def order_spec(config: ProjectConfig) -> dict[str, Any] | None:
    """job.json's ``order`` for a run of this project: ``{"strategy", "batch"}``, or None when Potato 2.12
    does not serve by model_review or nothing is written back."""
    wb = config.model_training.writeback
    if assignment_strategy(config.raw) != MODEL_REVIEW or not wb.schemas:
        return None
    return {"strategy": wb.order, "batch": order_batch(config)}


def order_batch(config: ProjectConfig) -> int:
    """How many items annotators label between two runs: ``order_batch``, else auto_retrain's
    ``update_frequency`` when auto-retraining, else ``DEFAULT_BATCH``."""
    mt = config.model_training
    if mt.writeback.order_batch:
        return mt.writeback.order_batch
    return mt.auto_retrain.update_frequency if mt.auto_retrain.enabled else DEFAULT_BATCH


def model_confidences(payload: Any) -> list[float]:
    """Every confidence of the model in one payload (what 2.12 finds, less the place this module put there)."""
    return payload_confidences(payload, skip=ORDER_KEY)


def strip_order(payload: Any) -> Any:
    """*payload* without a place in an order (None when the place was all it held)."""
    if isinstance(payload, dict) and ORDER_KEY in payload:
        rest = {k: v for k, v in payload.items() if k != ORDER_KEY}
        return rest if set(rest) - {"run_id"} else None
    if isinstance(payload, list) and payload and isinstance(payload[0], dict) and ORDER_KEY in payload[0]:
        return [{k: v for k, v in payload[0].items() if k != ORDER_KEY}] + payload[1:]
    return payload


def is_order_only(payload: Any) -> bool:
    """Whether *payload* holds a place in the order and nothing else to show."""
    return isinstance(payload, dict) and ORDER_KEY in payload and not set(payload) - {ORDER_KEY, "run_id"}


class ReviewOrder:
    """One writeback's order: what each item's predictions say (``observe``, ``observe_rank``), the ranks
    that follow (``ranked``) and the records with their places (``records``)."""

    def __init__(self, strategy: str, n_items: int, schemes: Mapping[str, Scheme], written: Sequence[str],
                 run_id: int):
        self.strategy, self.run_id, self.written = strategy, run_id, list(written)
        self.labels = {name: len(s.labels) for name, s in schemes.items()}
        self.numbers = array("d", [math.nan]) * n_items
        self.ranks = array("q", [-1]) * n_items  # an order line's rank (the worker's): these go first
        self.seen = bytearray(n_items)
        # The schema an item with no payload that has room gets one in.
        self.own_schema = next((name for name in self.written if name in schemes
                                and schemes[name].annotation_type.strip().lower() in CONFIDENCE_ONLY_TYPES), None)
        self.unplaced = 0  # ranked items with no room for their place
        self.predicted = False  # any prediction seen (a run of order lines only is a cold start)

    @property
    def by(self) -> str:
        """Who ranked the items: the strategy, or ``cold-start`` for a run of order lines only."""
        return COLD_START if not self.predicted and any(rank >= 0 for rank in self.ranks) else self.strategy

    @property
    def writes_places(self) -> bool:
        return self.by != LEAST_CONFIDENCE

    def observe(self, index: int, prediction: Prediction) -> None:
        """An item's prediction that passed the writeback's rules (whether or not it pre-fills)."""
        number = schema_uncertainty(self.strategy, prediction.kind, prediction.confidence, prediction.probs,
                                    self.labels.get(prediction.schema, 0),
                                    prediction.answer if prediction.kind == "span" else None)
        self.seen[index] = 1
        self.predicted = True
        known = self.numbers[index]
        if number is not None:
            self.numbers[index] = number if math.isnan(known) else item_uncertainty((known, number))

    def observe_rank(self, index: int, rank: int) -> None:
        """An order line's rank for an item (several schemas' ranks: the lowest, so their orders interleave)."""
        self.seen[index] = 1
        if self.ranks[index] < 0 or rank < self.ranks[index]:
            self.ranks[index] = rank

    def ranked(self, ids: Sequence[str]) -> list[int]:
        """The items this order ranks, first served first: the order lines' (by rank), then by number
        (highest first), ties by id; items whose predictions say nothing are not ranked."""
        with_rank = [i for i in range(len(ids)) if self.ranks[i] >= 0]
        with_rank.sort(key=lambda i: (self.ranks[i], -_number(self.numbers[i]), ids[i]))
        rest = [i for i in range(len(ids)) if self.seen[i] and self.ranks[i] < 0 and not math.isnan(self.numbers[i])]
        rest.sort(key=lambda i: (-self.numbers[i], ids[i]))
        return with_rank + rest

    def records(self, records: Any, ids: Sequence[str]) -> Iterator[Placed]:
        """``(index, id, predictions with their place, run ids, predictions as the run record keeps them)``
        for each item to write, in item order. *records* is a function giving the writeback table's
        ``(index, id, predictions, run_ids)`` afresh (it is read twice: confidences first)."""
        by = self.by
        order = self.ranked(ids) if by != LEAST_CONFIDENCE else []
        position = {index: k for k, index in enumerate(order)}
        own = array("d", [math.inf]) * len(ids)
        floor = math.inf
        for index, _, predictions, _ in records():
            lowest = min((c for p in predictions.values() for c in model_confidences(p)), default=math.inf)
            if index in position:
                own[index] = lowest
            else:
                floor = min(floor, lowest)
        scores = _scores([own[i] for i in order], floor)
        for index, item_id, predictions, run_ids in _merge(records(), sorted(order), ids):
            kept = predictions
            if index in position:
                k = position[index]
                place = {"by": by, "rank": k + 1, "score": scores[k]}
                predictions = self.mark(predictions, place)
                if predictions is None:
                    self.unplaced += 1
                    predictions = kept
            if predictions:
                yield index, item_id, predictions, run_ids, kept

    def mark(self, predictions: Mapping[str, Any], place: dict[str, Any]) -> dict[str, Any] | None:
        """*predictions* with *place* in the first payload that has room, else in a payload of its own;
        None when neither can be."""
        names = [s for s in self.written if s in predictions] + [s for s in predictions if s not in self.written]
        for name in names:
            payload = predictions[name]
            if isinstance(payload, dict):
                return {**predictions, name: {**payload, ORDER_KEY: place}}
            if isinstance(payload, list) and payload and isinstance(payload[0], dict):
                return {**predictions, name: [{**payload[0], ORDER_KEY: place}] + payload[1:]}
        if self.own_schema is None or self.own_schema in predictions:
            return None
        return {**predictions, self.own_schema: {ORDER_KEY: place, "run_id": self.run_id}}


def _number(value: float) -> float:
    return -1.0 if math.isnan(value) else value


def _scores(lowest: Sequence[float], floor: float) -> list[float]:
    """Each ranked item's score: rising with its rank, never above its own lowest confidence, the lowest of
    the items after it, or *floor* (the lowest confidence of the items not ranked)."""
    n = len(lowest)
    caps = [0.0] * n
    cap = min(floor, 1.0)
    for k in range(n - 1, -1, -1):
        cap = min(cap, lowest[k])
        caps[k] = cap
    return [caps[k] * (k + 1) / (n + 1) for k in range(n)]


def _merge(records: Iterable[tuple[int, str, dict[str, Any], dict[str, int]]], ranked_indices: Sequence[int],
           ids: Sequence[str]) -> Iterator[tuple[int, str, dict[str, Any], dict[str, int]]]:
    """The table's records, with an empty one for each ranked item that has none, in item order."""
    pending = iter(ranked_indices)
    upcoming = next(pending, None)
    for record in records:
        index = record[0]
        while upcoming is not None and upcoming < index:
            yield upcoming, ids[upcoming], {}, {}
            upcoming = next(pending, None)
        if upcoming == index:
            upcoming = next(pending, None)
        yield record
    while upcoming is not None:
        yield upcoming, ids[upcoming], {}, {}
        upcoming = next(pending, None)
