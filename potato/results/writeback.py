"""Writeback: a run's predictions, where the annotators of a Potato 2.12 server see them.

The file is ``<output_annotation_dir>/training/predictions.jsonl``, in the shape
Potato 2.12's one public door for outside predictions reads
(``pre_annotation.predictions_file``; ``quality_control._load_prediction_file``):
one record per item, its id and, under ``writeback.field``, each schema's
prediction in the shape 2.12 pre-fills that type from (``potato.prefill.writeback_shapes``)::

    {"id": "r1", "predictions": {"sentiment": {"label": "positive", "confidence": 0.93, "run_id": 7}}}
    {"id": "r2", "predictions": {"topics": [{"label": "food", "confidence": 0.81}], "score": 35},
     "run_ids": {"topics": 7, "score": 7}}

A shape with no room for the run that wrote it (a list, a bare label,
number or string) has it under the record's ``run_ids``.

2.12 reads the file once, when it starts: a new model reaches annotators at
that server's next restart (docs/beside-potato-2.12.md) — unless the
writeback is live (``writeback.live``): then ``potato.results.live_writeback`` puts
each item's record of this file into the item's own record in the watched
``data_directory``, and a running 2.12 shows it within one poll. The file is
replaced atomically (a temporary file beside it, fsync, rename), so a server
starting at that moment reads the old file or the new one, never half.

Rules, applied in order to each line of the run's ``predictions.jsonl``;
every prediction held back is counted under its rule, and the run log shows
the counts, because a writeback that silently writes nothing looks broken:

1. **Readable.** The predictions were written by a worker that may have run
   on another machine and reached us through an agent's upload, so each line
   is checked where it enters, as its schema's kind says
   (``potato.prefill.prediction_shapes``: a string ``id``, a ``schema`` of the run,
   a ``label`` of that schema and a ``confidence`` from 0 to 1, or a
   ``value``, ``spans`` or ``text``). A bad line is skipped and named in the
   run log; it never fails the run. Fields we do not use are ignored.
2. **The schema gate.** Only ``writeback.schemas`` are written: turning on
   training must not change what annotators see until someone asks for it.
3. **An item of this run.** An id the run's bundle does not hold is not an
   item of the project.
4. **The leak guard.** An item whose human label the run trained on (a label
   for the schema and ``holdout: false`` in the server's own copy of the
   bundle, never what the worker reports) is never written back: a model is
   confident about its own training data for reasons that say nothing about
   new data, and an accepted prelabel would launder that into the next round.
   When decision-calibrate rewrites an earlier run's predictions, that run's
   own record of what it trained on (``runs/<id>/labels.jsonl``) decides.
5. **include_unlabeled.** Without it, items nobody labelled are not written.
6. **min_confidence.** Below it, a prelabel costs an annotator attention
   (a prediction without a confidence — a number, spans, text — is not held
   back by it; a span below it is dropped from its list). Under
   ``assignment_strategy: model_review`` such an item keeps its confidence
   only (``potato.prefill.writeback_shapes.confidence_only``), so that 2.12 serves it
   among the first, pre-filling nothing; the run log counts them. A pairwise
   or ranking prediction is always written that way (2.12 pre-fills no
   comparison; ``potato.config`` allows it under model_review only), so it is
   not held back by this rule.
7. **Something to show.** An empty set, no span left, or spans of an item
   2.12 shows from a list, a mapping or ``displayed_text`` (their offsets
   count another text) pre-fill nothing, so they are not written.

**The order.** Under ``assignment_strategy: model_review`` the items that
pass rules 3-5 are ranked by ``writeback.order`` and the order lines of the
run (``potato.prefill.review_order``), and each item's rank is carried in one
mapping beside the model's confidence, so that 2.12 serves them in that
order; items that only hold a place pre-fill nothing.

Newest run wins, per schema: a run replaces every earlier prediction of the
schemas it writes back, so a prelabel an earlier run left on an item this run
trained on is taken down too. Other schemas' predictions stay. Each run keeps
what it wrote back in ``runs/<id>/written-back.jsonl`` (one line per item and
schema, ``{"id", "schema", "prefill"}``): a retract (``potato.results.retract``) puts
an earlier run's back from there. A run's own ``runs/<id>/predictions.jsonl``
is changed only by decision-calibrate, which keeps the worker's original
beside it; annotators' files are never opened.

What the file holds after the run is summed up for the Training page: items
pre-filled, items holding a confidence only, and the ten least certain items
nobody labelled (the first ``model_review`` serves), by the lowest confidence
of their predictions as 2.12 reads it.
"""

from __future__ import annotations

import fcntl
import json
import re
from array import array
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import orjson

from potato.config import MODEL_REVIEW, ProjectConfig, Scheme, assignment_strategy
from potato.errors import WritebackError
from potato.items.json_lines import read_lines
from potato.prefill.prediction_shapes import OrderRank, is_confidence, parse_line
from potato.prefill.review_order import ReviewOrder, model_confidences, order_spec, strip_order
from potato.prefill.writeback_shapes import (
    CONFIDENCE_ONLY_TYPES,
    confidence_only,
    describe_payload,
    is_confidence_only,
    payload_confidences,
    prefill,
)
from potato.runs.paths import private_dir, run_paths
from potato.runs.store import MAX_RUN_ID
from potato.training import atomic_files
from potato.training.answer_kinds import NOMINAL, ORDER_ONLY_KINDS, SPAN
from potato.training.escaping import json_bytes

# How many bad lines the run log names before it only counts them.
EXAMPLES = 5
# How many of the least certain unlabelled items the Training page lists.
LEAST_CERTAIN = 10

# The rules that hold a prediction back, in order, with how the run log names them.
HELD_BACK = {
    "not_an_item": "not an item of this run",
    "trained_on": "trained on (leak guard)",
    "unlabeled": "unlabelled (include_unlabeled is false)",
    "below_confidence": "below min_confidence",
    "nothing_to_show": "nothing to pre-fill",
    "duplicate": "repeated",
}


@dataclass
class WritebackSummary:
    """What one run's writeback did, per schema, and why each prediction held back was."""

    path: Path
    schemas: tuple[str, ...] = ()
    written: dict[str, int] = field(default_factory=dict)
    held_back: dict[str, dict[str, int]] = field(default_factory=dict)
    not_written_back: dict[str, int] = field(default_factory=dict)  # schemas not in writeback.schemas
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)
    # Held back by min_confidence but written as a confidence only (model_review), per schema.
    confidence_only: dict[str, int] = field(default_factory=dict)
    # The schemas whose every prediction is written as its confidence only (answer_kinds.ORDER_ONLY_KINDS).
    order_only: tuple[str, ...] = ()
    # What the writeback file holds afterwards, every schema: items with a pre-fill, items with a confidence only,
    # items with their place in the review order only (potato.prefill.review_order).
    items_prefilled: int = 0
    items_confidence_only: int = 0
    items_order_only: int = 0
    # The order model_review serves by (potato.prefill.review_order): its strategy, items ranked, ranked items
    # with no payload that could hold their place.
    order: str | None = None
    ranked: int = 0
    unplaced: int = 0
    # The least certain items nobody labelled: {"id", "confidence", "predictions": {schema: words}}.
    least_certain: list[dict[str, Any]] = field(default_factory=list)

    def hold(self, schema: str, rule: str) -> None:
        per_rule = self.held_back.setdefault(schema, {})
        per_rule[rule] = per_rule.get(rule, 0) + 1

    def bad(self, line_no: int, why: str) -> None:
        self.bad_lines += 1
        if len(self.bad_examples) < EXAMPLES:
            self.bad_examples.append(f"line {line_no}: {why}")

    def describe(self) -> str:
        """The run log's line: where, how many per schema, and what each rule held back."""
        if not self.schemas:
            return "Writeback: no schema of this run is listed in model_training.writeback.schemas"
        parts = []
        for schema in self.schemas:
            held = self.held_back.get(schema, {})
            text = f"{schema}: {self.written.get(schema, 0)} predictions"
            if schema in self.order_only:
                text += " as their confidence only (Potato 2.12 pre-fills no comparison; model_review orders by it)"
            reasons = [f"{held[rule]} {why}" + self._kept_confidence(schema, rule)
                       for rule, why in HELD_BACK.items() if held.get(rule)]
            if reasons:
                text += f" ({'; '.join(reasons)})"
            parts.append(text)
        for schema, n in self.not_written_back.items():
            parts.append(f"{schema}: {n} predictions not written back (not in model_training.writeback.schemas)")
        return f"Wrote back to {self.path}: " + "; ".join(parts) + self._order_words()

    def _order_words(self) -> str:
        if not self.order:
            return ""
        if not self.ranked:
            return f"; model_review order: {self.order} (2.12's own: lowest confidence first)"
        text = f"; model_review order: {self.order}, {self.ranked} items ranked"
        if self.unplaced:
            text += (f" ({self.unplaced} with no payload that can hold their place: slider and text answers are "
                     "bare values, so 2.12 serves those items after the others)")
        return text

    def _kept_confidence(self, schema: str, rule: str) -> str:
        n = self.confidence_only.get(schema, 0) if rule == "below_confidence" else 0
        return f", {n} of them as their confidence only (model_review)" if n else ""

    def as_dict(self) -> dict[str, Any]:
        """What the Training page shows of the writeback (the run's ``writeback.json``)."""
        found = asdict(self)
        found["path"] = str(self.path)
        found["schemas"] = list(self.schemas)
        return found

    def describe_bad_lines(self, predictions: Path) -> str | None:
        """The run log's warning about unreadable prediction lines, or None."""
        if not self.bad_lines:
            return None
        more = self.bad_lines - len(self.bad_examples)
        listed = "; ".join(self.bad_examples) + (f"; and {more} more" if more else "")
        return (f"{predictions}: {self.bad_lines} prediction line(s) could not be read and were "
                f"skipped ({listed})")


def writeback_path(config: ProjectConfig) -> Path:
    return config.writeback_file


# How _write spells each prediction's run (json.dumps' default separators): in a prediction, or in the
# record's run_ids. In a JSON string a quote is escaped, so '"run_id": ' followed by a digit can only be
# that key, and '"run_ids": {' only the record's mapping, whose values are run ids.
_RUN_ID = re.compile(rb'"run_id": (\d+)')
_RUN_IDS = re.compile(rb'"run_ids": \{([^{}]*)\}')
_ID_VALUE = re.compile(rb'": (\d+)')


def live_run_ids(config: ProjectConfig) -> set[int]:
    """The runs whose predictions the writeback file holds now (what annotators see pre-filled)."""
    try:
        data = writeback_path(config).read_bytes()
    except FileNotFoundError:
        return set()
    found = set(_RUN_ID.findall(data))
    for mapping in set(_RUN_IDS.findall(data)):
        found.update(_ID_VALUE.findall(mapping))
    return {int(run_id) for run_id in found}


def live_runs_by_schema(config: ProjectConfig) -> dict[str, int]:
    """Per schema of ``writeback.schemas``, the run whose predictions of it annotators see now (newest run
    wins per schema, so one run holds each; the most common, should an interrupted writeback have left two)."""
    field_name, schemas = config.model_training.writeback.field, set(config.model_training.writeback.schemas)
    path = writeback_path(config)
    if not path.is_file():
        return {}
    counts: dict[str, dict[int, int]] = {}
    for _, raw in _lines(path):
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            try:
                record = json.loads(raw)  # a lone surrogate's escape
            except ValueError:
                continue
        if not isinstance(record, dict):
            continue
        predictions, run_ids = record.get(field_name), record.get("run_ids") or {}
        if not isinstance(predictions, dict) or not isinstance(run_ids, dict):
            continue
        for schema, payload in predictions.items():
            if schema not in schemas:
                continue
            owner = _run_id(payload.get("run_id") if isinstance(payload, dict) else run_ids.get(schema))
            if owner:
                counts.setdefault(schema, {})[owner] = counts.get(schema, {}).get(owner, 0) + 1
    return {schema: max(owners, key=owners.get) for schema, owners in counts.items()}


@contextmanager
def writeback_lock(config: ProjectConfig) -> Iterator[None]:
    """Hold the project's writeback lock: one writer at a time of the writeback file and the items' records
    (a run's results, decision-calibrate, a retract, ``potato start``'s catching up), across processes."""
    private_dir(config.training_dir)
    with open(config.training_dir / "writeback.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    # errors="replace": a stray byte is one bad line, not a crash of the whole writeback.
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line_no, line in enumerate(fh, start=1):
            if line.strip():
                yield line_no, line


class _Table:
    """Predictions per schema, in the bundle's item order: compact arrays for radio-like schemas (a label
    index, a confidence and a run per item, not a dict per item), the pre-fill value for the others."""

    def __init__(self, n_items: int, labels: dict[str, Sequence[str]], compact: set[str]):
        self.n = n_items
        self.labels = labels  # schema -> its labels: a prediction is stored as its label's index
        self._index = {schema: {label: i for i, label in enumerate(names)} for schema, names in labels.items()}
        self.compact = compact
        self.columns: dict[str, tuple[array, array, array]] = {}
        self.values: dict[str, dict[int, tuple[Any, int]]] = {}

    NONE, CONFIDENCE_ONLY = -1, -2  # a radio-like schema's label index for no prediction, for a confidence only

    def put(self, schema: str, index: int, label: str | None, confidence: float, run_id: int) -> None:
        """Store a radio-like prediction (*label* None: its confidence only); ValueError when *label* is not
        (or no longer) a label of *schema*."""
        if schema not in self.columns:
            self.columns[schema] = (array("l", [self.NONE]) * self.n, array("d", [0.0]) * self.n,
                                    array("q", [0]) * self.n)
        labels, confidences, runs = self.columns[schema]
        if label is None:
            labels[index] = self.CONFIDENCE_ONLY
        elif label not in self._index[schema]:
            raise ValueError(f"{label!r} is not a label of {schema!r}")
        else:
            labels[index] = self._index[schema][label]
        confidences[index], runs[index] = confidence, run_id

    def put_value(self, schema: str, index: int, value: Any, run_id: int) -> None:
        """Store any other schema's pre-fill value."""
        self.values.setdefault(schema, {})[index] = (value, run_id)

    def put_confidence(self, schema: str, index: int, confidence: float, run_id: int) -> None:
        """Store a confidence without an answer (``writeback_shapes.confidence_only``)."""
        if schema in self.compact:
            self.put(schema, index, None, confidence, run_id)
        else:
            self.put_value(schema, index, confidence_only(confidence), run_id)

    def has(self, schema: str, index: int) -> bool:
        if schema in self.columns:
            return self.columns[schema][0][index] != self.NONE
        return index in self.values.get(schema, ())

    def records(self, ids: Sequence[str]) -> Iterator[tuple[int, str, dict[str, Any], dict[str, int]]]:
        """``(index, id, {schema: prediction}, {schema: run id}``) for each item with a prediction, in item
        order; the run ids of the shapes that cannot hold theirs."""
        columns = list(self.columns.items())
        values = list(self.values.items())
        for index, item_id in enumerate(ids):
            predictions, run_ids = {}, {}
            for schema, (labels, confidences, runs) in columns:
                label = labels[index]
                if label >= 0:
                    predictions[schema] = {"label": self.labels[schema][label],
                                           "confidence": confidences[index], "run_id": runs[index]}
                elif label == self.CONFIDENCE_ONLY:
                    predictions[schema] = {**confidence_only(confidences[index]), "run_id": runs[index]}
            for schema, per_item in values:
                found = per_item.get(index)
                if found is not None:
                    predictions[schema], run_ids[schema] = found
            if predictions:
                yield index, item_id, predictions, run_ids


class _Bundle:
    """What the server's own copy of the run's bundle says about each item, one flag byte per item
    (and, for a run with spans to write back, the items' texts: spans move to 2.12's rendered text)."""

    LABELLED, TRAINED, NO_SPAN_OFFSETS = 1, 2, 4

    def __init__(self, bundle_dir: Path, trained_on: Mapping[str, set[str]] | None = None,
                 keep_texts: bool = False):
        self.path = bundle_dir
        try:
            manifest = json.loads((bundle_dir / "manifest.json").read_text(encoding="utf-8"))
            self.labels: dict[str, list[str]] = manifest["schemas"]
            answers = manifest.get("answers") or {}
            self.kinds = {schema: (answers.get(schema) or {}).get("kind", NOMINAL) for schema in self.labels}
            self.ids: list[str] = []
            self.index: dict[str, int] = {}
            self.texts: list[str] = []
            self.flags: dict[str, bytearray] = {schema: bytearray() for schema in self.labels}
            with open(bundle_dir / "items.jsonl", encoding="utf-8") as fh:
                for n, line in enumerate(fh):
                    item = json.loads(line)
                    self.index[item["id"]] = n
                    self.ids.append(item["id"])
                    if keep_texts:
                        self.texts.append(item.get("text") or "")
                    labels = item.get("labels") or {}
                    elsewhere = self.NO_SPAN_OFFSETS if item.get("span_offsets") is False else 0
                    for schema, flags in self.flags.items():
                        labelled = schema in labels
                        trained = (labelled and not item.get("holdout")) if trained_on is None \
                            else item["id"] in trained_on.get(schema, ())
                        flags.append((labelled or trained) * self.LABELLED | trained * self.TRAINED | elsewhere)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise WritebackError(
                f"Nothing was written back: the run's bundle ({bundle_dir}) cannot be read ({exc}), and "
                "without it the items the run trained on cannot be kept out"
            ) from exc

    def has(self, flag: int, schema: str, index: int) -> bool:
        return bool(self.flags[schema][index] & flag)


def _read_earlier(target: Path, field_name: str, keep: set[str], bundle: _Bundle, table: _Table) -> None:
    """Earlier runs' predictions of the schemas in *keep*, for items of this bundle, into *table*."""
    if not target.is_file():
        return
    for _, line in _lines(target):
        try:
            record = json.loads(line)
            index = bundle.index[record["id"]]
            # A file from before this format held one line per item and schema.
            predictions = record[field_name] if field_name in record else {record["schema"]: record}
            run_ids = record.get("run_ids") or {}
            for schema, prediction in predictions.items():
                if schema not in keep:
                    continue
                if schema in table.compact:
                    if is_confidence(prediction.get("confidence")):
                        table.put(schema, index, None if is_confidence_only(prediction) else prediction["label"],
                                  float(prediction["confidence"]), _run_id(prediction.get("run_id")))
                else:
                    prediction = strip_order(prediction)  # the newest writeback orders afresh (review_order)
                    if prediction is not None:
                        table.put_value(schema, index, prediction, _run_id(run_ids.get(schema)))
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            continue  # an item no longer in the project, or a label the schema no longer has: dropped


def _run_id(value: Any) -> int:
    """The run id an earlier line names; 0 (unknown) for anything that is not one (``1e20``, ``Infinity``, text)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_RUN_ID:
        return value
    return 0


def write_back(config: ProjectConfig, run_id: int, run_schemas: Sequence[str], predictions: Path,
               bundle_dir: Path, *, trained_on: Mapping[str, set[str]] | None = None) -> WritebackSummary:
    """Merge run *run_id*'s *predictions* into the project's writeback file (rules: module docstring).

    *bundle_dir* is the server's own copy of the run's bundle. *trained_on*
    (ids per schema) replaces the bundle's word on which items the run trained
    on, when the bundle is a later one (decision-calibrate rewriting an earlier
    run's predictions). Raises ``WritebackError`` only when the file cannot be
    written or the bundle is gone; bad prediction lines are counted in the
    summary instead.
    """
    wb = config.model_training.writeback
    target = writeback_path(config)
    written_schemas = tuple(s for s in run_schemas if s in wb.schemas)
    schemes = {s.name: s for s in config.schemes}
    summary = WritebackSummary(path=target, schemas=written_schemas, order_only=tuple(
        s for s in written_schemas if s in schemes and schemes[s].kind in ORDER_ONLY_KINDS))
    if not written_schemas or not predictions.is_file():
        return summary
    bundle = _Bundle(bundle_dir, trained_on, keep_texts=any(
        s in schemes and schemes[s].kind == SPAN for s in written_schemas))
    # Earlier runs' schemas are not in this run's bundle: their labels come from the config.
    labels = {s.name: s.labels for s in config.schemes if s.name in wb.schemas} | bundle.labels
    compact = {name for name in wb.schemas if name in schemes and schemes[name].kind == NOMINAL}
    table = _Table(len(bundle.ids), labels, compact)
    _read_earlier(target, wb.field, set(wb.schemas) - set(written_schemas), bundle, table)
    highlight = bool(config.raw.get("highlight_linebreaks", False))
    # Schemas whose held-back items keep their confidence, for model_review to order them by.
    ordered = {name for name in written_schemas if assignment_strategy(config.raw) == MODEL_REVIEW
               and name in schemes and schemes[name].annotation_type.strip().lower() in CONFIDENCE_ONLY_TYPES}
    spec = order_spec(config)
    order = ReviewOrder(spec["strategy"], len(bundle.ids), schemes, written_schemas, run_id) if spec else None
    summary.order = spec["strategy"] if spec else None

    for line_no, line in _lines(predictions):
        try:
            prediction = parse_line(line, bundle.kinds, bundle.labels)
        except ValueError as exc:
            summary.bad(line_no, str(exc))
            continue
        schema = prediction.schema
        if schema not in written_schemas:
            if not isinstance(prediction, OrderRank):
                summary.not_written_back[schema] = summary.not_written_back.get(schema, 0) + 1
            continue
        index = bundle.index.get(prediction.item_id)
        # The order sees what passes rules 3-5 (an item of the run, not trained on, include_unlabeled),
        # whatever rules 6 and 7 then write of it.
        ordered_item = (order is not None and index is not None and not bundle.has(bundle.TRAINED, schema, index)
                        and (wb.include_unlabeled or bundle.has(bundle.LABELLED, schema, index)))
        if isinstance(prediction, OrderRank):
            if ordered_item:
                order.observe_rank(index, prediction.rank)
            continue
        if ordered_item and not table.has(schema, index):
            order.observe(index, prediction)
        if index is None:
            summary.hold(schema, "not_an_item")
        elif bundle.has(bundle.TRAINED, schema, index):
            summary.hold(schema, "trained_on")
        elif not wb.include_unlabeled and not bundle.has(bundle.LABELLED, schema, index):
            summary.hold(schema, "unlabeled")
        elif (prediction.confidence is not None and prediction.confidence < wb.min_confidence
              and prediction.kind not in ORDER_ONLY_KINDS):  # a pre-fill's threshold; these pre-fill nothing
            summary.hold(schema, "below_confidence")
            if schema in ordered and not table.has(schema, index):
                table.put_confidence(schema, index, prediction.confidence, run_id)
                summary.confidence_only[schema] = summary.confidence_only.get(schema, 0) + 1
        elif table.has(schema, index):
            summary.hold(schema, "duplicate")
        elif schema in table.compact:
            table.put(schema, index, prediction.answer, prediction.confidence, run_id)
            summary.written[schema] = summary.written.get(schema, 0) + 1
        else:
            value = _prefill(schemes.get(schema), prediction, bundle, index, wb.min_confidence, highlight)
            if value is None:
                summary.hold(schema, "nothing_to_show")
            else:
                table.put_value(schema, index, value, run_id)
                summary.written[schema] = summary.written.get(schema, 0) + 1

    _write(target, wb.field, bundle, table, summary, order)
    _write_run_record(run_paths(config, run_id).written_back, wb.field, bundle, table, written_schemas)
    return summary


def _prefill(scheme: Scheme | None, prediction, bundle: _Bundle, index: int, min_confidence: float,
             highlight: bool) -> Any:
    if scheme is None or (prediction.kind == SPAN and bundle.has(bundle.NO_SPAN_OFFSETS, prediction.schema, index)):
        return None
    text = bundle.texts[index] if bundle.texts else None
    return prefill(scheme, prediction, text, min_confidence=min_confidence, highlight_linebreaks=highlight)


def _write(target: Path, field_name: str, bundle: _Bundle, table: _Table, summary: WritebackSummary,
           order: ReviewOrder | None = None) -> None:
    """One record per item with a prediction (or a place in *order*), in item order; replaced atomically.
    What it holds is summed up in *summary* (items pre-filled, with a confidence or a place only, and the
    first unlabelled ones model_review serves, by the number 2.12 finds, each with the model's own confidence)."""
    unlabelled = [bundle.flags[s] for s in summary.schemas]
    least: list[tuple[float, str, dict[str, Any]]] = []
    rows = (order.records(lambda: table.records(bundle.ids), bundle.ids) if order is not None
            else ((i, item_id, p, r, p) for i, item_id, p, r in table.records(bundle.ids)))
    try:
        with replacing(target) as out:
            for index, item_id, predictions, run_ids, kept in rows:
                out.write(record_line(item_id, field_name, predictions, run_ids))
                if not kept:
                    summary.items_order_only += 1
                elif all(map(is_confidence_only, kept.values())):
                    summary.items_confidence_only += 1
                else:
                    summary.items_prefilled += 1
                if unlabelled and not any(flags[index] & bundle.LABELLED for flags in unlabelled):
                    served = [c for p in predictions.values() for c in payload_confidences(p)]
                    if served and (len(least) < LEAST_CERTAIN or (min(served), item_id) < least[-1][:2]):
                        least.append((min(served), item_id, predictions))
                        least.sort(key=lambda entry: entry[:2])
                        del least[LEAST_CERTAIN:]
    except OSError as exc:
        raise WritebackError(f"Could not write the predictions to {target}: {exc.strerror or exc}") from exc
    if order is not None:
        summary.order = order.by
        summary.ranked, summary.unplaced = (len(order.ranked(bundle.ids)) if order.writes_places else 0), order.unplaced
    texts = _texts_of(bundle.path, {item_id for _, item_id, _ in least})
    summary.least_certain = [
        {"id": _shown_id(item_id), "text": texts.get(item_id, ""),
         "confidence": min((c for p in predictions.values() for c in model_confidences(p)), default=None),
         "predictions": {schema: _described(p, schema in summary.order_only)
                         for schema, p in predictions.items()}}
        for _, item_id, predictions in least]


def _described(payload: Any, order_only: bool) -> str:
    shown = strip_order(payload)
    if shown is None:
        return "nothing pre-filled (its place in the order only)"
    return describe_payload(shown, order_only)


def _texts_of(bundle_dir: Path, ids: set[str], limit: int = 200) -> dict[str, str]:
    """The texts of the few items *ids* (the least certain ones the Training page shows), on one line and cut
    to *limit* characters. A bundle line starts with its id as orjson writes it: only those lines are decoded."""
    starts = {b'{"id":' + _id_json(item_id) + b',"text":': item_id for item_id in ids if isinstance(item_id, str)}
    found: dict[str, str] = {}
    if not starts:
        return found
    prefixes = tuple(starts)
    try:
        with open(bundle_dir / "items.jsonl", "rb") as fh:
            for line in fh:
                if line.startswith(prefixes):
                    item = json.loads(line)
                    text = " ".join(str(item.get("text") or "").split())
                    found[item["id"]] = text if len(text) <= limit else text[:limit - 1] + "…"
                    if len(found) == len(starts):
                        break
    except (OSError, ValueError):
        return found  # the texts are a help to the reader; the writeback itself is done
    return found


def _id_json(item_id: str) -> bytes:
    """An id as a bundle line holds it (``potato.items.json_lines.dump_line``: orjson, a lone surrogate as its escape)."""
    try:
        return orjson.dumps(item_id)
    except orjson.JSONEncodeError:
        return json_bytes(item_id)


def _shown_id(item_id: str, limit: int = 200) -> str:
    return item_id if len(item_id) <= limit else item_id[:limit - 1] + "…"


def record_line(item_id: str, field_name: str, predictions: Mapping[str, Any], run_ids: Mapping[str, int]) -> str:
    """One record of the writeback file: the item's id, its predictions under *field_name*, and the
    runs of the shapes that have no room for theirs."""
    record = {"id": item_id, field_name: predictions, **({"run_ids": run_ids} if run_ids else {})}
    return json.dumps(record, ensure_ascii=False) + "\n"


@contextmanager
def replacing(target: Path) -> Iterator[Any]:
    """A text file to write in place of *target* (the writeback file, a run's record of it): a temporary
    beside it, fsynced and renamed over it at the end."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_files.replacing_text(target) as out:
        yield out


def _write_run_record(path: Path, field_name: str, bundle: _Bundle, table: _Table, schemas: Sequence[str]) -> None:
    """The run's own record of what it wrote back of *schemas* (``written-back.jsonl``, module docstring),
    its lines of other schemas kept (decision-calibrate rewrites some of a run's schemas)."""
    kept = [line for line in run_record(path) if line["schema"] not in schemas]
    try:
        with replacing(path) as out:
            for line in kept:
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
            for _, item_id, predictions, _ in table.records(bundle.ids):
                for schema in schemas:
                    if schema in predictions:
                        out.write(json.dumps({"id": item_id, "schema": schema, "prefill": predictions[schema]},
                                             ensure_ascii=False) + "\n")
    except OSError as exc:
        raise WritebackError(f"Could not keep the run's writeback in {path}: {exc.strerror or exc}") from exc


def run_record(path: Path) -> Iterator[dict[str, Any]]:
    """The lines of a run's ``written-back.jsonl`` (none when it has none)."""
    return read_lines(path)


def write_report(config: ProjectConfig, run_id: int, report: Mapping[str, Any]) -> None:
    """Keep what the Training page shows of run *run_id*'s writeback (``writeback.json``)."""
    path = run_paths(config, run_id).writeback_report
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_files.write_bytes(path, json_bytes(report, indent=2))


def read_report(config: ProjectConfig, run_id: int) -> dict[str, Any] | None:
    """Run *run_id*'s writeback report, or None."""
    try:
        return json.loads(run_paths(config, run_id).writeback_report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """A writeback report in words, for the Training page: what annotators see, and what each rule held back."""
    lines = [f"{report['items_prefilled']} item(s) pre-filled"]
    if report.get("items_confidence_only"):
        lines[0] += (f"; {report['items_confidence_only']} item(s) hold their confidence only (below "
                     "min_confidence: nothing pre-filled, served first under model_review)")
    if report.get("items_order_only"):
        lines[0] += (f"; {report['items_order_only']} item(s) hold their place in the model_review order only "
                     "(nothing pre-filled)")
    if report.get("ranked"):
        lines.append(f"Under model_review Potato 2.12 serves {report['ranked']} item(s) in the order "
                     f"{report['order']!r} ranks them (docs/answer-types.md, \"The order under model_review\")")
    for schema in report.get("schemas", []):
        held = report.get("held_back", {}).get(schema, {})
        reasons = [f"{held[rule]} {why}" for rule, why in HELD_BACK.items() if held.get(rule)]
        lines.append(f"{schema}: {report.get('written', {}).get(schema, 0)} predictions written; "
                     + ("held back: " + "; ".join(reasons) if reasons else "none held back"))
    lines.extend(report.get("gate") or ())
    live = report.get("live")
    if live:
        lines.append(live["text"])
    return lines
