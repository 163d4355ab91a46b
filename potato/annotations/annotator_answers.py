"""Annotators' answers that are not label votes: numbers, free text, spans, and who answered each item.

``potato.annotations.labels`` counts label votes (radio, select, likert, multiselect):
each ticked label of an item is one vote, packed and tallied at C speed.
The other answer types Potato 2.12.1 stores differently (each checked
against its own ``POST /updateinstance`` and its page, in ``user_state.json``):

- **slider** and **number**: one entry whose value is the number as text,
  ``[{"schema": "score", "name": "slider"}, "35"]``;
- **text**/**textbox**: ``[{"schema": "summary", "name": "text_box"}, "…"]``,
  one entry per box;
- **pairwise** (kind comparison): ``[{"schema": "pref", "name": "selection"},
  "B"]`` (``A``, ``B`` or ``tie``), or on a scale ``[{"schema": "pref",
  "name": "scale_value"}, "-2"]`` (below 0 the first response is better,
  above it the second, 0 neither); read as ``A``, ``B`` or ``tie``. With
  ``randomize_order`` the sides are the order the annotator saw, which 2.12
  records in ``instance_id_to_presentation_order`` (``{item: {schema: [1,
  0]}}``: the item's second response was shown first); an order recorded is
  mapped back to the item's.
- **bws** (kind best_worst): ``[{"schema": "quality", "name": "best"}, "C"]``
  and ``[{"schema": "quality", "name": "worst"}, "A"]``: positions in the
  tuple (``potato.items.bws_tuples``), the item being the tuple.
- **ranking**: ``[{"schema": "quality", "name": "rank_order"}, "Response B,Response A,Response C"]``:
  the labels in the annotator's order, best first, joined by commas (an
  empty value: the annotator moved nothing, no answer). A label may hold a
  comma, so the value is split on the labels themselves, longest first, as
  2.12.1's widget splits it; a value that is not an order of all the
  labels, each once, is skipped and named.
- **span**: not under ``instance_id_to_label_to_value`` at all but under
  ``instance_id_to_span_to_value``, ``{item: [[{"schema", "name", "start",
  "end", "title", "id"}, VALUE], …]}``, with ``start``/``end`` counted on the
  text 2.12's page renders (``potato.items.rendered_text``). Its page writes the id
  ``<schema>_<label>_<start>_<end>`` and VALUE ``1``; its ``/updateinstance``
  ``span_annotations`` write ``<schema>_<label>___<start>_<end>`` and the
  covered text. Only ``schema``, ``name``, ``start`` and ``end`` are read.

And one fact the votes cannot carry: **who answered an item at all**. An
annotator who saved an item (any entry under either member) and ticked no
box of a multiselect said "none of these"; one who drew no span on it said
"no span here". Multilabel and span aggregation count those annotators
(``potato.annotations.aggregation``), so ``answered`` is read whenever a run has such a
schema.

Read only for runs with such schemas (a radio-only project never comes
here), in the same pass over each annotator's file that counts its votes
(``AnswersBeside`` rides on ``potato.annotations.labels.read_votes``): a
bundle reads each ``user_state.json`` once. A file is read whole or
contributes nothing, to the votes and to these answers alike.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from potato.annotations.json_chunks import Batch
from potato.annotations.labels import LABELS_MEMBER, SPANS_MEMBER, parse_label_entries, read_votes
from potato.config import Scheme
from potato.items.data_warnings import GroupedWarnings
from potato.training.answer_kinds import (
    BEST,
    BEST_WORST,
    COMPARISON,
    CONTINUOUS,
    MULTILABEL,
    RANKING,
    SIDES,
    SPAN,
    TEXT,
    TIE,
    WORST,
)

# The name under which 2.12 stores a ranking's order (its hidden input's label_name).
RANK_ORDER = "rank_order"
# Where 2.12 records the order each annotator was shown a pairwise item's responses in.
PRESENTATION_MEMBER = "instance_id_to_presentation_order"
# The names a pairwise answer is stored under: binary mode's choice, scale mode's number.
_CHOICE_NAMES = ("selection", "scale_value")

# A span's id when its record is a dict keyed by it: <schema>_<label>_<start>_<end> (or ___ before start).
_SPAN_ID = re.compile(r"^(?P<prefix>.*?)_{1,3}(?P<start>\d+)_(?P<end>\d+)$")


@dataclass
class AnnotatorAnswers:
    """What the annotators answered beyond label votes.

    ``answered[item]``: how many annotators saved an answer on the item;
    ``answered_by[user]``: their items (kept with ``per_user``, for consensus).
    ``values[schema][item]``: each annotator's number (continuous) or text
    (text), in annotator order. ``spans[schema][item]``: ``(user, start, end,
    label)`` of every annotator's spans, offsets on 2.12's rendered text.
    ``choices[schema][item]``: each annotator's side of a comparison (``A``,
    ``B`` or ``tie``, on the item's own order of its responses).
    ``picks[schema][item]``: each annotator's ``(best, worst)`` positions in a
    tuple (either None when they gave only the other).
    ``orders[schema][item]``: each annotator's order of the schema's labels, best first.
    """

    answered: dict[str, int] = field(default_factory=dict)
    answered_by: dict[str, set[str]] = field(default_factory=dict)
    values: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    spans: dict[str, dict[str, list[tuple[str, int, int, str]]]] = field(default_factory=dict)
    choices: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    picks: dict[str, dict[str, list[tuple[str | None, str | None]]]] = field(default_factory=dict)
    orders: dict[str, dict[str, list[tuple[str, ...]]]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    skipped_answers: int = 0


def needs_answers(schemes: Iterable[Scheme]) -> bool:
    """Whether a run over *schemes* needs ``read_answers`` (anything but nominal and ordinal)."""
    return any(s.kind in (MULTILABEL, CONTINUOUS, TEXT, SPAN, COMPARISON, BEST_WORST, RANKING) for s in schemes)


def read_answers(annotation_dir: Path, schemes: Sequence[Scheme], base: Path | None = None, *,
                 per_user: bool = False) -> AnnotatorAnswers:
    """Read the answers of *schemes* that ``potato.annotations.labels`` does not count, alone.

    A bundle reads them in the votes' pass instead (``AnswersBeside``); this
    is that pass with no votes to count. Never raises on a bad file: it is
    skipped with a warning. Answers that are not what their schema takes (a
    slider's ``"abc"``, a span label the schema lacks, a span whose start is
    not before its end) are skipped and counted, in grouped warnings.
    """
    beside = AnswersBeside(schemes, per_user=per_user)
    votes = read_votes(annotation_dir, [], base, beside=beside)
    answers = beside.answers()
    answers.warnings[:0] = votes.warnings
    return answers


class AnswersBeside:
    """Reads the answers that are not votes in ``read_votes``' pass over each file (``ReadBeside``).

    ``answers()``, after that pass: what the files read whole held, and the
    grouped warnings for answers a schema does not take (the vote reader
    names the files it skipped).
    """

    def __init__(self, schemes: Sequence[Scheme], *, per_user: bool = False) -> None:
        self.reader = _FileReader({s.name: s for s in schemes})
        self.per_user = per_user
        # The order each annotator saw is honoured wherever 2.12 recorded one (it records it under
        # randomize_order), so answers given before randomize_order was turned off still count as meant.
        self.members = (LABELS_MEMBER, SPANS_MEMBER) + ((PRESENTATION_MEMBER,) if self.reader.compared else ())
        self.result = AnnotatorAnswers(values={s.name: {} for s in schemes if s.kind in (CONTINUOUS, TEXT)},
                                       spans={s.name: {} for s in schemes if s.kind == SPAN},
                                       choices={s.name: {} for s in schemes if s.kind == COMPARISON},
                                       picks={s.name: {} for s in schemes if s.kind == BEST_WORST},
                                       orders={s.name: {} for s in schemes if s.kind == RANKING})

    def open_file(self) -> _FileAnswers:
        return _FileAnswers(self.reader)

    def keep(self, user: str, shown: str, one: _FileAnswers) -> None:
        for schema, per_item in one.picks.items():
            for item_id in [i for i, picked in per_item.items() if picked.get(BEST) == picked.get(WORST)]:
                one.problems.append((("same pick", schema, per_item.pop(item_id)[BEST]), item_id))
        _merge(self.result, user, one, self.per_user)
        for key, item_id in one.problems:
            self.reader.problems.add((shown, *key), item_id)
            self.result.skipped_answers += 1

    def answers(self) -> AnnotatorAnswers:
        self.result.warnings.extend(self.reader.problems.render(_problem_text))
        return self.result


class _FileAnswers:
    """One file's answers, batch by batch (``FileReadBeside``)."""

    def __init__(self, reader: _FileReader) -> None:
        self.reader = reader
        self.answered: set[str] = set()
        self.values: dict[str, dict[str, list[Any]]] = {}
        self.spans: dict[str, dict[str, list[tuple[int, int, str]]]] = {}
        self.choices: dict[str, dict[str, str]] = {}
        self.picks: dict[str, dict[str, dict[str, str]]] = {}  # schema -> item -> {"best": A, "worst": D}
        self.ranked: dict[str, dict[str, tuple[str, ...]]] = {}  # schema -> item -> the labels, best first
        self.orders: dict[str, dict[str, Any]] = {}  # item -> schema -> the order its responses were shown in
        self.problems: list[tuple[tuple, str]] = []

    def add(self, member: str, batch: Batch) -> None:
        keys, texts, values = batch
        for item_id, text in zip(keys, texts):
            self.reader.read(self, member, item_id, values[text])


def _merge(result: AnnotatorAnswers, user: str, one: _FileAnswers, per_user: bool) -> None:
    for item_id in one.answered:
        result.answered[item_id] = result.answered.get(item_id, 0) + 1
    if per_user:
        result.answered_by[user] = one.answered
    for schema, per_item in one.values.items():
        into = result.values[schema]
        for item_id, values in per_item.items():
            into.setdefault(item_id, []).extend(values)
    for schema, per_item in one.spans.items():
        into = result.spans[schema]
        for item_id, spans in per_item.items():
            into.setdefault(item_id, []).extend((user, *span) for span in spans)
    for schema, per_item in one.choices.items():
        into = result.choices[schema]
        for item_id, choice in per_item.items():
            if choice != TIE and (one.orders.get(item_id) or {}).get(schema) == [1, 0]:
                choice = SIDES[1 - SIDES.index(choice)]  # shown swapped: the item's first response was B
            into.setdefault(item_id, []).append(choice)
    for schema, per_item in one.picks.items():
        into = result.picks[schema]
        for item_id, picked in per_item.items():
            into.setdefault(item_id, []).append((picked.get(BEST), picked.get(WORST)))
    for schema, per_item in one.ranked.items():
        into = result.orders[schema]
        for item_id, order in per_item.items():
            into.setdefault(item_id, []).append(order)


class _FileReader:
    """Turns one file's entries into a ``_FileAnswers`` for the schemes being read."""

    def __init__(self, schemes: dict[str, Scheme]):
        self.kinds = {name: scheme.kind for name, scheme in schemes.items()}
        self.valued = {n for n, kind in self.kinds.items() if kind in (CONTINUOUS, TEXT)}
        self.spanned = {n: set(s.labels) for n, s in schemes.items() if self.kinds[n] == SPAN}
        self.compared = {n for n, kind in self.kinds.items() if kind == COMPARISON}
        self.tupled = {n: set(s.labels) for n, s in schemes.items() if self.kinds[n] == BEST_WORST}
        # A ranking's labels, longest first: the order in which a value is matched against them.
        self.ranking = {n: sorted(s.labels, key=len, reverse=True) for n, s in schemes.items()
                        if self.kinds[n] == RANKING}
        self.problems = GroupedWarnings()

    def read(self, one: _FileAnswers, member: str, item_id: str, entry: Any) -> None:
        if member == PRESENTATION_MEMBER:
            if isinstance(entry, dict):
                one.orders[item_id] = entry
            return
        if entry:
            one.answered.add(item_id)
        if member == LABELS_MEMBER:
            if self.valued or self.compared or self.tupled or self.ranking:
                self._values(one, item_id, entry)
        elif self.spanned:
            self._spans(one, item_id, entry)

    def _values(self, one: _FileAnswers, item_id: str, entry: Any) -> None:
        try:
            pairs = list(parse_label_entries(entry))
        except ValueError:
            return  # the vote reader names an unreadable entry
        for schema, name, value in pairs:
            if schema in self.compared:
                self._choice(one, item_id, schema, name, value)
                continue
            if schema in self.tupled:
                self._pick(one, item_id, schema, name, value)
                continue
            if schema in self.ranking:
                self._order(one, item_id, schema, name, value)
                continue
            if schema not in self.valued:
                continue
            if self.kinds[schema] == CONTINUOUS:
                number = _number(value)
                if number is None:
                    one.problems.append((("number", schema, _short(value)), item_id))
                    continue
                value = number
            elif not isinstance(value, str) or not value.strip():
                continue  # an empty box is no answer
            one.values.setdefault(schema, {}).setdefault(item_id, []).append(value)

    def _choice(self, one: _FileAnswers, item_id: str, schema: str, name: str, value: Any) -> None:
        if name not in _CHOICE_NAMES:
            return  # a justification, or a dimension of a mode not trained
        if name == "selection":
            choice = value.strip() if isinstance(value, str) else None
            choice = TIE if choice is not None and choice.lower() == TIE else choice
            if choice not in (*SIDES, TIE):
                one.problems.append((("choice", schema, _short(value)), item_id))
                return
        else:
            number = _number(value)
            if number is None:
                one.problems.append((("number", schema, _short(value)), item_id))
                return
            choice = SIDES[0] if number < 0 else SIDES[1] if number > 0 else TIE
        one.choices.setdefault(schema, {})[item_id] = choice

    def _pick(self, one: _FileAnswers, item_id: str, schema: str, name: str, value: Any) -> None:
        if name not in (BEST, WORST):
            return
        position = value.strip() if isinstance(value, str) else None
        if not position:
            return  # the hidden input before a pick: no answer
        if position not in self.tupled[schema]:
            one.problems.append((("position", schema, _short(value)), item_id))
            return
        one.picks.setdefault(schema, {}).setdefault(item_id, {})[name] = position

    def _order(self, one: _FileAnswers, item_id: str, schema: str, name: str, value: Any) -> None:
        if name != RANK_ORDER or (isinstance(value, str) and not value.strip()):
            return  # an untouched widget stores an empty order: no answer
        labels = self.ranking[schema]
        order = split_order(value, labels)
        if order is None:
            one.problems.append((("order", schema, _short(value)), item_id))
            return
        one.ranked.setdefault(schema, {})[item_id] = order

    def _spans(self, one: _FileAnswers, item_id: str, entry: Any) -> None:
        for schema, label, start, end in _span_records(entry, self.spanned):
            if schema not in self.spanned:
                continue
            if label not in self.spanned[schema]:
                one.problems.append((("span label", schema, label), item_id))
            elif not (_whole(start) and _whole(end) and 0 <= start < end):
                one.problems.append((("span range", schema, ""), item_id))
            else:
                one.spans.setdefault(schema, {}).setdefault(item_id, []).append((start, end, label))


def _span_records(entry: Any, spanned: dict[str, set[str]]) -> Iterator[tuple[str, str, Any, Any]]:
    """``(schema, label, start, end)`` of each span in one item's record of ``instance_id_to_span_to_value``."""
    if isinstance(entry, list):
        for pair in entry:
            meta = pair[0] if isinstance(pair, (list, tuple)) and pair else pair
            if isinstance(meta, dict) and "schema" in meta:
                yield str(meta.get("schema")), str(meta.get("name")), meta.get("start"), meta.get("end")
    elif isinstance(entry, dict):  # keyed by span id
        for key in entry:
            found = _SPAN_ID.match(str(key))
            if found is None:
                continue
            for schema, labels in spanned.items():
                for label in labels:
                    if found["prefix"] == f"{schema}_{label}":
                        yield schema, label, int(found["start"]), int(found["end"])


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def split_order(value: Any, labels: Sequence[str]) -> tuple[str, ...] | None:
    """The labels of a ranking's stored *value* (``"B,A,C"``, or a list), or None when it is not an order of
    all *labels* (longest first) each once. Each place is matched against the labels before a comma is
    looked for, so a label that holds a comma stays whole."""
    if isinstance(value, list):
        found = [part.strip() if isinstance(part, str) else None for part in value]
    elif isinstance(value, str):
        found, rest, comma = [], value, ","
        while comma:
            rest = rest.lstrip()
            label = next((lab for lab in labels if rest.startswith(lab) and rest[len(lab):].lstrip()[:1] in ("", ",")),
                         None)
            if label is None:
                head, comma, rest = rest.partition(",")
                label = head.strip()
            else:
                _, comma, rest = rest[len(label):].partition(",")
            found.append(label)
    else:
        return None
    if len(found) != len(labels) or set(found) != set(labels):
        return None
    return tuple(found)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _problem_text(key: tuple, listed: str) -> str:
    shown, what, schema, detail = key
    if what == "number":
        return (f"{shown}: item(s) {listed} have {detail} for schema {schema!r}, which is not a number; "
                f"those answers were skipped")
    if what == "choice":
        return (f"{shown}: item(s) {listed} have {detail} for schema {schema!r}, which is not A, B or tie; "
                f"those answers were skipped")
    if what == "same pick":
        return (f"{shown}: item(s) {listed} have {detail!r} as both the best and the worst of schema {schema!r}; "
                f"those answers were skipped")
    if what == "position":
        return (f"{shown}: item(s) {listed} have {detail} for schema {schema!r}, which is not a position of "
                f"its tuples (bws_config.tuple_size); those answers were skipped")
    if what == "order":
        return (f"{shown}: item(s) {listed} have {detail} for schema {schema!r}, which is not an order of all "
                f"its labels, each once; those answers were skipped")
    if what == "span label":
        return (f"{shown}: item(s) {listed} have spans labelled {detail!r} for schema {schema!r}, which is not "
                f"one of its labels; those spans were skipped")
    return (f"{shown}: item(s) {listed} have spans of schema {schema!r} whose start is not a whole number "
            f"before their end; those spans were skipped")
