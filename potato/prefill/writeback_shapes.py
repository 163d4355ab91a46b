"""A checked prediction in the shape Potato 2.12's annotate page pre-fills from, per annotation type.

Measured against a running 2.12.1 (a new annotator's page after a restart,
and in a browser): each type pre-fills only from its own shape, and quietly
shows nothing for any other.

==========================  =====================================================
type                        written back
==========================  =====================================================
radio, select               ``{"label", "confidence"}`` (select: 2.12 shows nothing)
multiselect                 a list of ``{"label", "confidence"}``, one per predicted
                            label (one dict ticks one box; a dict whose ``label`` is a
                            list ticks none)
likert with ``labels:``     ``{"label", "confidence"}`` (2.12 takes the label, as from a
                            bare label name; the confidence orders ``model_review``)
likert without ``labels:``  ``{"label", "confidence"}``, the point as text ("4");
                            2.12 pre-fills nothing
slider                      a bare number, inside ``min_value``..``max_value`` and on
                            ``step`` (a dict is rendered as its text)
number                      a bare number; 2.12 pre-fills nothing
span                        a list of ``{"start", "end", "label"}`` on the text 2.12
                            renders (``potato.items.rendered_text``), confidence kept
text, textbox               the bare string
pairwise (binary, scale),   ``{"confidence": c}`` only, under ``model_review``: 2.12
ranking                     pre-fills no comparison, so the payload orders the item
                            (c: the preferred side's probability; a ranking's, that
                            its first is first) and shows nothing
==========================  =====================================================

``min_confidence`` holds back a prediction whose ``confidence`` is below it.
A kind whose predictions may come without one (a number, spans, text) is
written when it has none: there is nothing to compare. A span's own
confidence is compared span by span: the spans below it are dropped, the
rest written. A prediction with nothing left to show (an empty set, no span)
is not written.

**A confidence only.** Under ``assignment_strategy: model_review`` Potato 2.12
serves an item only when its data holds a prediction, least confident first
(the lowest ``confidence``, ``score``, ``probability`` or ``prob`` anywhere in
it). A prediction held back by ``min_confidence`` is then written as
``{"confidence": c}``: ordered, and pre-filling nothing — measured against a
running 2.12.1 for each type in ``CONFIDENCE_ONLY_TYPES``. A slider or a text
box shows such a mapping as its text, so they never get one. The same types
take an item's place in the order (``potato.prefill.review_order``) as a mapping of
its own, ``{"review_order": {…}}``, which pre-fills nothing either.

**Comparisons.** 2.12 pre-fills no pairwise or ranking answer, so their
payload is always a confidence only (``ORDER_ONLY_KINDS``): it is written
under ``model_review`` alone (``potato.config`` refuses it otherwise) and
is there to order the items. Seen in a browser on 2.12.1's annotate page:
the A/B tiles, the scale's slider and the ranking list are the same with
the payload and without it. A ``bws`` tuple is built by 2.12 at start-up
and is in no data file: nothing can be written into it.
"""

from __future__ import annotations

from typing import Any

from potato.config import Scheme
from potato.items.rendered_text import spans_to_rendered
from potato.prefill.prediction_shapes import Prediction
from potato.training.answer_kinds import CONTINUOUS, MULTILABEL, NOMINAL, ORDER_ONLY_KINDS, ORDINAL, SPAN, TEXT


def prefill(scheme: Scheme, prediction: Prediction, text: str | None, *, min_confidence: float = 0.0,
            highlight_linebreaks: bool = False) -> Any:
    """The value 2.12 pre-fills *scheme* from, for *prediction*; None when nothing is left to show.

    *text* is the item's own text (the bundle's), for spans.
    """
    kind = prediction.kind
    if kind in (NOMINAL, ORDINAL):
        return {"label": prediction.answer, "confidence": prediction.confidence}
    if kind == MULTILABEL:
        if not prediction.answer:
            return None
        probs = dict(zip(scheme.labels, prediction.probs)) if prediction.probs else {}
        return [{"label": label, "confidence": probs.get(label, prediction.confidence)} for label in prediction.answer]
    if kind == CONTINUOUS:
        return on_scale(prediction.answer, scheme)
    if kind == SPAN:
        kept = [span for span in prediction.answer if span.get("confidence", 1.0) >= min_confidence]
        shown = spans_to_rendered(text or "", kept, highlight_linebreaks)
        return shown or None
    if kind == TEXT:
        return prediction.answer if prediction.answer.strip() else None
    if kind in ORDER_ONLY_KINDS:
        return confidence_only(prediction.confidence)
    return None


def on_scale(value: float, scheme: Scheme) -> float | int:
    """*value* inside the slider's range and on its step (as its control can hold it); a number
    schema's as it is. Whole numbers come out as ``int`` (``35``, not ``35.0``)."""
    if scheme.min_value is not None and scheme.max_value is not None:
        low, high, step = scheme.min_value, scheme.max_value, scheme.step or 1.0
        steps = round((min(max(value, low), high) - low) / step)
        value = low + steps * step
        if value > high:
            value -= step
        value = round(value, 10)
    return int(value) if float(value).is_integer() else value


# The types whose page pre-fills nothing from ``{"confidence": c}`` (measured on 2.12.1's annotate page).
CONFIDENCE_ONLY_TYPES = frozenset({"radio", "select", "multiselect", "likert", "number", "span", "pairwise", "ranking"})
# The keys of a payload Potato 2.12's model_review reads a confidence from (its model_review.CONFIDENCE_KEYS).
CONFIDENCE_KEYS = ("confidence", "score", "probability", "prob")


def confidence_only(confidence: float) -> dict[str, float]:
    """What an item held back by ``min_confidence`` holds under model_review: its confidence, no answer."""
    return {"confidence": confidence}


def is_confidence_only(payload: Any) -> bool:
    """Whether *payload* is a confidence only (``confidence_only``), which pre-fills nothing."""
    return isinstance(payload, dict) and "label" not in payload and "confidence" in payload


def payload_confidences(payload: Any, skip: str | None = None) -> list[float]:
    """Every confidence in one schema's payload, as Potato 2.12's model_review finds them (the first of
    ``CONFIDENCE_KEYS`` in each mapping, at any depth); below a key *skip*, none."""
    found: list[float] = []
    stack = [payload]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in CONFIDENCE_KEYS:
                value = node.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    found.append(float(value))
                    break
            stack.extend(v for k, v in node.items() if k != skip and isinstance(v, (list, dict)))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (list, dict)))
    return found


def describe_payload(payload: Any, order_only: bool = False) -> str:
    """A payload as the Training page names it: ``positive (0.93)``, ``food, price``, ``35``, ``2 spans``…
    (*order_only*: of a kind in ``ORDER_ONLY_KINDS``, whose confidence is all there ever is to write)."""
    if is_confidence_only(payload):
        if order_only:
            return f"confidence {payload['confidence']:.2f} (orders the item; pre-fills nothing)"
        return f"held back (confidence {payload['confidence']:.2f})"
    if isinstance(payload, dict) and "label" in payload:
        confidence = payload.get("confidence")
        return f"{payload['label']}" + (f" ({confidence:.2f})" if isinstance(confidence, (int, float)) else "")
    if isinstance(payload, list):
        if payload and all(isinstance(p, dict) and "start" in p for p in payload):
            return f"{len(payload)} span{'s' if len(payload) != 1 else ''}"
        return ", ".join(str(p.get("label")) if isinstance(p, dict) else str(p) for p in payload)
    text = str(payload)
    return text if len(text) <= 60 else text[:59] + "…"
