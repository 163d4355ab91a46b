"""What an annotation scheme's config says about the shape of its answers, per annotation type.

Potato 2.12 keeps each type's settings in the scheme's own keys; training
needs a few of them: an ordinal scale's points, a slider's range and step.
Read here, once, into ``Scheme`` fields (``potato.config``); the bundle's
``answers`` (docs/answer-types.md) and the writeback's shapes come from them.

- ``likert``: with ``labels:`` 2.12 draws a radio group and stores the label
  name; the scale's points are the labels, low to high, in the order listed.
  Without ``labels:`` it draws ``size`` points and stores each point's number
  as text (``{"rating:4": "4"}``, measured against 2.12.1), so the points
  are ``"1"`` … ``str(size)``. Either way point *i* (from 1) has the value *i*.
- ``slider``: ``min_value``, ``max_value`` (2.12 requires both and makes them
  integers) and ``step`` (default 1). A slider with ``labels:`` is drawn by
  2.12 as a radio group; its answers are then labels, not numbers.
- ``number``: no range; any number.
- ``pairwise``: two responses to the item, a list of two under the item's
  ``items_key`` (default ``text``), compared. ``mode: binary`` (the default)
  stores ``A``, ``B`` or, with ``allow_tie``, ``tie``; ``mode: scale`` stores
  the slider's number, from ``scale.min`` (the first response much better)
  to ``scale.max`` (the second), 0 for neither; ``randomize_order`` shows each
  annotator the pair in an order of its own, recorded beside the answer.
  ``labels`` only names the two tiles: the answer is ``A`` or ``B`` whatever
  they say. ``mode: multi_dimension`` (one answer per dimension) trains
  nothing yet.
- ``bws``: best–worst scaling. Each item is a tuple of the data's texts
  that 2.12 builds from the top-level ``bws_config``
  (``potato.items.bws_tuples``); the answer is two positions, ``A``, ``B``, …:
  the best text's and the worst's. The scheme's labels are the positions.
  Tuples built round by round from earlier answers (``ibws_config``) train
  nothing yet.
- ``ranking``: the annotator drags the scheme's ``labels`` into an order,
  best first; 2.12 stores the labels joined by commas. What each label
  stands for in an item (a response held in a field of that name, a line of
  the text, or the label itself) is ``potato.items.ranking_texts``'.
  ``allow_ties`` is accepted and, as in 2.12.1's widget, changes nothing.

Pure: returns values and problem texts, the config module turns the problems
into errors naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from potato.training.answer_kinds import SIDES, UNSUPPORTED, kind_of_type

PAIRWISE_MODES = ("binary", "scale", "multi_dimension")
# The modes of a pairwise scheme this version trains.
TRAINED_PAIRWISE_MODES = ("binary", "scale")

# 2.12's position labels: an annotator's answer is one of them.
POSITION_LABELS = tuple(chr(ord("A") + i) for i in range(26))


@dataclass(frozen=True)
class BwsConfig:
    """A project's top-level ``bws_config``, with 2.12.1's defaults: ``num_tuples`` ``ceil(items ×
    min_item_appearances / tuple_size)``, ``min_item_appearances`` ``2 × tuple_size`` (each item in about
    eight tuples of four)."""

    tuple_size: int = 4
    num_tuples: int | None = None
    seed: int = 42
    min_item_appearances: int | None = None

    @property
    def positions(self) -> tuple[str, ...]:
        return POSITION_LABELS[:self.tuple_size]

    def tuple_count(self, pool_size: int) -> int:
        if self.num_tuples:
            return self.num_tuples
        appearances = self.min_item_appearances or 2 * self.tuple_size
        return max(math.ceil(pool_size * appearances / self.tuple_size), 1)


def read_bws_config(raw: Any) -> tuple[BwsConfig | None, list[tuple[str, str]]]:
    """``(BwsConfig, [(key, problem)])`` from the config's ``bws_config`` value (None: the key is absent)."""
    if raw is None:
        return None, []
    if not isinstance(raw, Mapping):
        return None, [("", f"is {raw!r}; use a mapping, e.g. bws_config: {{tuple_size: 4}}")]
    problems: list[tuple[str, str]] = []
    values: dict[str, Any] = {}
    for key, low, optional in (("tuple_size", 2, False), ("seed", None, False), ("num_tuples", 1, True),
                               ("min_item_appearances", 1, True)):
        value = raw.get(key)
        if value is None and (optional or key not in raw):
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        if not whole or (low is not None and value < low):
            need = "a whole number" if low is None else f"a whole number of at least {low}"
            problems.append((key, f"is {value!r}; use {need}" + (" or leave it out" if optional else "")))
            continue
        values[key] = value
    if values.get("tuple_size", 4) > len(POSITION_LABELS):
        problems.append(("tuple_size", f"is {values['tuple_size']}; Potato labels a tuple's positions A to Z, so "
                                       f"use at most {len(POSITION_LABELS)}"))
    return (BwsConfig(**values) if not problems else None), problems


# A scale with more points than this is not a likert a person answers; a typo (size: 1000).
MAX_LIKERT_SIZE = 100


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def scheme_fields(entry: Mapping[str, Any], labels: tuple[str, ...],
                  positions: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``(Scheme keyword arguments, [(key, problem)])`` for the answer shape of one scheme *entry*.

    *labels* are the scheme's labels as listed; *positions* a tuple's
    (``bws_config``). A problem is a sentence about ``entry[key]`` without the
    key path (the caller adds it).
    """
    annotation_type = str(entry.get("annotation_type") or "").strip().lower()
    problems: list[tuple[str, str]] = []
    fields: dict[str, Any] = {}
    if annotation_type == "likert" and not labels:
        size = entry.get("size")
        if isinstance(size, int) and not isinstance(size, bool) and 2 <= size <= MAX_LIKERT_SIZE:
            fields["labels"] = tuple(str(point) for point in range(1, size + 1))
            fields["size"] = size
        else:
            problems.append(("size", f"is {size!r}; a likert without labels needs size, the number of "
                                      f"points on its scale (a whole number from 2 to {MAX_LIKERT_SIZE})"))
    elif annotation_type == "likert":
        fields["size"] = len(labels)
    elif annotation_type == "slider" and not labels:
        low, high = _number(entry.get("min_value")), _number(entry.get("max_value"))
        for key, value in (("min_value", low), ("max_value", high)):
            if value is None:
                problems.append((key, f"is {entry.get(key)!r}; a slider needs min_value and max_value (numbers)"))
        if low is not None and high is not None and low >= high:
            problems.append(("max_value", f"is {entry.get('max_value')!r}, not above min_value "
                                          f"{entry.get('min_value')!r}"))
        step = _number(entry.get("step", 1))
        if step is None or step <= 0:
            problems.append(("step", f"is {entry.get('step')!r}; use a number above 0"))
        if not problems:
            fields.update(min_value=low, max_value=high, step=step)
    elif annotation_type == "pairwise":
        _pairwise_fields(entry, fields, problems)
    elif annotation_type == "bws":  # no positions: no bws_config, its tuples built round by round (ibws_config)
        fields.update(labels=positions, mode="tuples" if positions else "iterative")
    elif annotation_type == "ranking" and len(labels) < 2:
        problems.append(("labels", f"lists {len(labels)} label(s); a ranking orders its labels, so list at least "
                                   f"two (the responses or options annotators put in order)"))
    return fields, problems


def _pairwise_fields(entry: Mapping[str, Any], fields: dict[str, Any], problems: list[tuple[str, str]]) -> None:
    """A pairwise scheme's mode, where its two responses are, and the scale's range (2.12.1's defaults)."""
    mode = str(entry.get("mode") or "binary").strip().lower()
    if mode not in PAIRWISE_MODES:
        problems.append(("mode", f"is {entry.get('mode')!r}; use one of {', '.join(PAIRWISE_MODES)}"))
        return
    items_key = entry.get("items_key", "text")
    if not isinstance(items_key, str) or not items_key.strip():
        problems.append(("items_key", f"is {items_key!r}; name the item's field that holds the two responses"))
        return
    fields.update(labels=SIDES, mode=mode, items_key=items_key)
    if mode == "scale":
        scale = entry.get("scale") if isinstance(entry.get("scale"), Mapping) else {}
        low, high = _number(scale.get("min", -3)), _number(scale.get("max", 3))
        if low is None or high is None or not low < 0 < high:
            problems.append(("scale", f"is {entry.get('scale')!r}; a pairwise scale runs from a negative min (the "
                                      f"first response better) through 0 to a positive max (the second)"))
        else:
            fields.update(min_value=low, max_value=high)


def answer_kind(annotation_type: str, labels: tuple[str, ...], mode: str = "") -> str:
    """The kind of a scheme's answers: its type's (``potato.training.answer_kinds``), except a slider
    with ``labels:``, which 2.12 draws and stores as a radio group, and a pairwise mode not trained yet."""
    kind = kind_of_type(annotation_type)
    annotation_type = annotation_type.strip().lower()
    if annotation_type == "slider" and labels:
        return kind_of_type("radio")
    if annotation_type == "pairwise" and (mode or "binary") not in TRAINED_PAIRWISE_MODES:
        return UNSUPPORTED
    if annotation_type == "bws" and mode == "iterative":
        return UNSUPPORTED
    return kind


def untrained_reason(annotation_type: str, mode: str = "") -> str:
    """Why a scheme of kind ``unsupported`` trains nothing, as the end of a sentence."""
    annotation_type = (annotation_type or "").strip().lower()
    if annotation_type == "pairwise":
        return (f"a pairwise schema in mode {mode} (one answer per dimension) is not trained yet; mode binary or "
                f"scale is")
    if annotation_type == "bws":
        return ("its tuples come round by round from earlier answers (ibws_config), which is not trained yet; "
                "tuples built once from bws_config are")
    return f"no trainer trains {annotation_type or 'its'} answers"


def answer_spec(scheme: Any) -> dict[str, Any]:
    """A schema's entry in the bundle manifest's ``answers`` (docs/answer-types.md, "In the bundle")."""
    spec: dict[str, Any] = {"type": scheme.annotation_type, "kind": scheme.kind}
    if scheme.kind == "ordinal":
        spec["values"] = list(range(1, len(scheme.labels) + 1))
    elif scheme.kind == "continuous" and scheme.min_value is not None:
        spec.update(min=_plain(scheme.min_value), max=_plain(scheme.max_value), step=_plain(scheme.step))
    elif scheme.kind == "comparison":
        spec.update(mode=scheme.mode, items_key=scheme.items_key)
    elif scheme.kind == "best_worst":
        spec["tuple_size"] = len(scheme.labels)
    elif scheme.kind == "ranking":
        spec["size"] = len(scheme.labels)
    if scheme.description:  # the question annotators are asked, for trainers that write it into a prompt
        spec["description"] = scheme.description
    return spec


def _plain(number: float) -> float | int:
    """``35`` for 35.0, so the manifest reads as the config was written."""
    return int(number) if float(number).is_integer() else number
