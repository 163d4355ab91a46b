"""One line of a run's ``predictions.jsonl``, checked: the one place that says what each kind's prediction is.

A worker may have run on another machine and its predictions reached the
server through an agent's upload, so every line is checked where it enters,
field by field, and a bad one is refused naming the field
(docs/answer-types.md, "In predictions.jsonl"):

======================  ==============================================================
kind                    fields besides ``id`` and ``schema``
======================  ==============================================================
nominal, ordinal        ``label`` (a label of the schema), ``confidence`` (0–1)
multilabel              ``label`` (a list of the schema's labels), ``confidence`` (0–1)
continuous              ``value`` (a finite number); ``confidence`` optional
span                    ``spans`` (``[{"start", "end", "label", "confidence"?}]``,
                        whole offsets, start before end); ``confidence`` optional
text                    ``text`` (any string JSON can carry); ``confidence`` optional
comparison              ``label`` (``A`` or ``B``: the response the model prefers),
                        ``confidence`` (0–1, its probability); ``probs`` ``[A, B]``
best_worst              ``label`` (the position predicted best), ``worst`` (another
                        position: the one predicted worst), ``confidence`` (0–1, the
                        best's probability); ``probs`` one per position
ranking                 ``order`` (every label once, the predicted order, best first),
                        ``label`` (its first), ``confidence`` (0–1, the first's
                        probability of being first); ``probs`` one per label
======================  ==============================================================

``probs`` (one probability per label, schema order) is optional and kept
only when it is that; other fields are ignored.

**Order lines** carry no answer: ``{"id", "schema", "order_rank"}`` (a whole
number from 0, the first item to serve), written by a worker that orders
items where its model is (the ``diverse`` order, cold start:
``potato.training.trainers.diverse_order``, ``potato.training.trainers.cold_start``) and read
by ``potato.prefill.review_order``; ``parse_line`` tells the two apart. Two checks:
``check_answer_fields`` for the upload, which knows no schema (it takes any
kind's fields in their shape), and ``parse_prediction`` for the writeback and
the evaluation, which knows each schema's kind and labels.

Pure; raises ``ValueError`` with a sentence naming the field.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

from potato.items.json_lines import read_lines
from potato.training.answer_kinds import (
    BEST,
    BEST_WORST,
    COMPARISON,
    CONTINUOUS,
    MULTILABEL,
    NOMINAL,
    ORDINAL,
    RANKING,
    SPAN,
    TEXT,
    WORST,
)
from potato.training.escaping import quote

# A label or a schema name: one cell of a table (what the upload accepts without knowing the schema).
MAX_NAME_CHARS = 300
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
ANSWER_FIELDS = ("label", "value", "spans", "text")


# The last order_rank a line may carry: more items than any project has.
MAX_ORDER_RANK = 2 ** 31 - 1


class OrderRank(NamedTuple):
    """A checked order line: the item's place (0 first) in its schema's order."""

    item_id: str
    schema: str
    rank: int


class Prediction(NamedTuple):
    """A checked prediction. ``answer``: the label (nominal, ordinal), the labels (multilabel), the
    number (continuous), the spans as dicts (span), the string (text), ``{"best", "worst"}`` (best_worst) or
    the order, a list of every label (ranking)."""

    item_id: str
    schema: str
    kind: str
    answer: Any
    confidence: float | None
    probs: list[float] | None


def is_confidence(value: Any) -> bool:
    """A number from 0 to 1 (not NaN, not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and 0 <= value <= 1)


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_NAME_CHARS and not _CONTROL.search(value)


def probs_of(value: Any, n_labels: int) -> list[float] | None:
    """*value* as the list of *n_labels* probabilities it should be, else None."""
    if not isinstance(value, list) or len(value) != n_labels or not all(is_confidence(p) for p in value):
        return None
    return [float(p) for p in value]


def _spans(value: Any, labels: Sequence[str] | None) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ValueError(f"spans is {quote(value)}, not a list of spans")
    out = []
    for i, span in enumerate(value):
        where = f"spans[{i}]"
        if not isinstance(span, dict):
            raise ValueError(f"{where} is {quote(span)}, not a span {{\"start\", \"end\", \"label\"}}")
        start, end, label = span.get("start"), span.get("end"), span.get("label")
        if not (_is_whole(start) and _is_whole(end) and 0 <= start < end):
            raise ValueError(f"{where} runs from {quote(start)} to {quote(end)}; start and end are whole "
                             "character offsets, start before end")
        if labels is None and not _is_name(label):
            raise ValueError(f"{where}.label is {quote(label)}, not a label")
        if labels is not None and label not in labels:
            raise ValueError(f"{where}.label is {quote(label)}, not a label of the schema")
        confidence = span.get("confidence")
        if confidence is not None and not is_confidence(confidence):
            raise ValueError(f"{where}.confidence is {quote(confidence)}; use a number from 0 to 1")
        out.append({"start": start, "end": end, "label": label,
                    **({"confidence": float(confidence)} if confidence is not None else {})})
    return out


def check_answer_fields(record: Mapping[str, Any]) -> None:
    """The answer fields of a line whose schema is not known here (the upload): each in its shape, one at least."""
    present = [name for name in ANSWER_FIELDS if record.get(name) is not None]
    if not present and record.get("order_rank") is not None:
        _order_rank(record.get("order_rank"))
        return
    if not present:
        raise ValueError("the line has no label, value, spans or text; each prediction has one")
    label = record.get("label")
    if label is not None and not (_is_name(label) or (isinstance(label, list) and all(map(_is_name, label)))):
        raise ValueError(f"label is {quote(label)}; use a label (a string) or a list of labels")
    value = record.get("value")
    if value is not None and not _is_number(value):
        raise ValueError(f"value is {quote(value)}; use a finite number")
    if record.get("spans") is not None:
        _spans(record["spans"], None)
    text = record.get("text")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"text is {quote(text)}; use a string")
    confidence = record.get("confidence")
    if confidence is not None and not is_confidence(confidence):
        raise ValueError(f"confidence is {quote(confidence)}; use a number from 0 to 1")
    if label is not None and confidence is None:
        raise ValueError("confidence is missing; a label comes with its confidence (a number from 0 to 1)")


def _order_rank(value: Any) -> int:
    if not (_is_whole(value) and 0 <= value <= MAX_ORDER_RANK):
        raise ValueError(f"order_rank is {quote(value)}; use a whole number from 0 (the first item to serve)")
    return value


def is_order_line(record: Mapping[str, Any]) -> bool:
    """Whether a parsed line is an order line (``order_rank`` and no answer field)."""
    return record.get("order_rank") is not None and all(record.get(name) is None for name in ANSWER_FIELDS)


def parse_line(line: str | Mapping[str, Any], kinds: Mapping[str, str],
               labels: Mapping[str, Sequence[str]]) -> Prediction | OrderRank:
    """A prediction or an order line (``parse_prediction``'s rules for the first); ``ValueError`` names the field."""
    record = _record(line)
    if not is_order_line(record):
        return parse_prediction(record, kinds, labels)
    item_id, schema = _item_and_schema(record, kinds)
    return OrderRank(item_id, schema, _order_rank(record["order_rank"]))


def _record(line: str | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(line, str):
        try:
            record = json.loads(line)
        except ValueError:
            raise ValueError("not JSON") from None
    else:
        record = line
    if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, not an object")
    return record


def _item_and_schema(record: Mapping[str, Any], kinds: Mapping[str, str]) -> tuple[str, str]:
    item_id, schema = record.get("id"), record.get("schema")
    if not isinstance(item_id, str) or not item_id:
        raise ValueError(f"id is {quote(item_id)}; use the item's id (a non-empty string)")
    if schema not in kinds:
        raise ValueError(f"schema is {quote(schema)}, not a schema of this run")
    return item_id, schema


def parse_prediction(line: str | Mapping[str, Any], kinds: Mapping[str, str],
                     labels: Mapping[str, Sequence[str]]) -> Prediction:
    """The prediction on one line (or an already parsed record), for a run whose schemas have
    *kinds* and *labels*; ``ValueError`` names the field that is wrong."""
    record = _record(line)
    item_id, schema = _item_and_schema(record, kinds)
    kind, names = kinds[schema], labels.get(schema, ())
    confidence = record.get("confidence")
    if confidence is not None and not is_confidence(confidence):
        raise ValueError(f"confidence is {quote(confidence)}; use a number from 0 to 1")
    if kind in _LABELLED and confidence is None:
        raise ValueError(f"confidence is {quote(confidence)}; use a number from 0 to 1")
    label = record.get("label")
    if kind in (NOMINAL, ORDINAL, COMPARISON):
        if label not in names:
            raise ValueError(f"label is {quote(label)}, not a label of {schema!r}")
        answer: Any = label
    elif kind == BEST_WORST:
        worst = record.get(WORST)
        if label not in names:
            raise ValueError(f"label is {quote(label)}, not a position of the tuples of {schema!r}")
        if worst not in names or worst == label:
            raise ValueError(f"worst is {quote(worst)}, not a position of the tuples of {schema!r} other than "
                             f"the best")
        answer = {BEST: label, WORST: worst}
    elif kind == RANKING:
        order = record.get("order")
        if not (isinstance(order, list) and all(isinstance(x, str) for x in order) and sorted(order) == sorted(names)):
            raise ValueError(f"order is {quote(order)}, not every label of {schema!r} once")
        if label != order[0]:
            raise ValueError(f"label is {quote(label)}, not the first of its order, {quote(order[0])}")
        answer = list(order)
    elif kind == MULTILABEL:
        if not (isinstance(label, list) and all(isinstance(x, str) and x in names for x in label)):
            raise ValueError(f"label is {quote(label)}, not a list of labels of {schema!r}")
        answer = [x for x in names if x in label]  # schema order, once each
    elif kind == CONTINUOUS:
        answer = record.get("value")
        if not _is_number(answer):
            raise ValueError(f"value is {quote(answer)}, not a number")
    elif kind == SPAN:
        try:
            answer = _spans(record.get("spans"), names)
        except ValueError as exc:
            raise ValueError(str(exc).replace("of the schema", f"of {schema!r}")) from None
    elif kind == TEXT:
        answer = record.get("text")
        if not isinstance(answer, str):
            raise ValueError(f"text is {quote(answer)}, not a string")
    else:
        raise ValueError(f"schema {schema!r} has answers no trainer predicts")
    return Prediction(item_id, schema, kind, answer, None if confidence is None else float(confidence),
                      probs_of(record.get("probs"), len(names)) if kind in _LABELLED else None)


# The kinds whose prediction is a label (or labels) with its confidence and, optionally, a probability per label.
_LABELLED = (NOMINAL, ORDINAL, MULTILABEL, COMPARISON, BEST_WORST, RANKING)


def schema_records(path: Path, schema: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of one schema in a run's ``predictions.jsonl``, unchecked: for the server's own
    summaries of a file the writeback has read (the quality gate's one-answer test, the stopping signal),
    which look at one field and skip what is not there. Unreadable lines are skipped; no file, none."""
    return (record for record in read_lines(path, skip_unreadable=True)
            if isinstance(record, dict) and record.get("schema") == schema)
