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
likert with ``labels:``     the label name
likert without ``labels:``  the point as text ("4"); 2.12 pre-fills nothing
slider                      a bare number, inside ``min_value``..``max_value`` and on
                            ``step`` (a dict is rendered as its text)
number                      a bare number; 2.12 pre-fills nothing
span                        a list of ``{"start", "end", "label"}`` on the text 2.12
                            renders (``potato.rendered_text``), confidence kept
text, textbox               the bare string
==========================  =====================================================

``min_confidence`` holds back a prediction whose ``confidence`` is below it.
A kind whose predictions may come without one (a number, spans, text) is
written when it has none: there is nothing to compare. A span's own
confidence is compared span by span: the spans below it are dropped, the
rest written. A prediction with nothing left to show (an empty set, no span)
is not written.
"""

from __future__ import annotations

from typing import Any

from potato.answer_kinds import CONTINUOUS, MULTILABEL, NOMINAL, ORDINAL, SPAN, TEXT
from potato.config import Scheme
from potato.prediction_shapes import Prediction
from potato.rendered_text import spans_to_rendered


def prefill(scheme: Scheme, prediction: Prediction, text: str | None, *, min_confidence: float = 0.0,
            highlight_linebreaks: bool = False) -> Any:
    """The value 2.12 pre-fills *scheme* from, for *prediction*; None when nothing is left to show.

    *text* is the item's own text (the bundle's), for spans.
    """
    kind = prediction.kind
    if kind == NOMINAL:
        return {"label": prediction.answer, "confidence": prediction.confidence}
    if kind == ORDINAL:
        return prediction.answer
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
