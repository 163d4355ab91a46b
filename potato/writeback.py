"""Writeback (SPEC §10, §11): a run's predictions, where the annotators of a Potato 2.12 server see them.

The file is ``<output_annotation_dir>/training/predictions.jsonl``, in the shape
Potato 2.12's one public door for outside predictions reads
(``pre_annotation.predictions_file``; ``quality_control._load_prediction_file``):
one record per item, its id and, under ``writeback.field``, each schema's
predicted label::

    {"id": "r1", "predictions": {"sentiment": {"label": "positive", "confidence": 0.93, "run_id": 7}}}

2.12 reads the file once, when it starts: a new model reaches annotators at
that server's next restart (README, "Beside Potato 2.12"). The file is
replaced atomically (a temporary file beside it, fsync, rename), so a server
starting at that moment reads the old file or the new one, never half.

Rules, applied in order to each line of the run's ``predictions.jsonl``;
every prediction held back is counted under its rule, and the run log shows
the counts, because a writeback that silently writes nothing looks broken:

1. **Readable.** The predictions were written by a worker that may have run
   on another machine and reached us through an agent's upload, so each line
   is checked where it enters: a JSON object with a string ``id`` and
   ``schema``, a ``label`` of that schema, a ``confidence`` that is a number
   from 0 to 1 (not NaN). A bad line is skipped and named in the run log; it
   never fails the run. Fields we do not use (``probs``, …) are ignored.
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
6. **min_confidence.** Below it, a prelabel costs an annotator attention.

Newest run wins, per schema: a run replaces every earlier prediction of the
schemas it writes back, so a prelabel an earlier run left on an item this run
trained on is taken down too. Other schemas' predictions stay. A run's own
``runs/<id>/predictions.jsonl`` is changed only by decision-calibrate, which
keeps the worker's original beside it; annotators' files are never opened.
"""

from __future__ import annotations

import json
import math
import os
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from potato.config import ProjectConfig
from potato.errors import PotatoError
from potato.store import MAX_RUN_ID
from potato.training.escaping import open_text, quote

# How many bad lines the run log names before it only counts them.
EXAMPLES = 5

# The rules that hold a prediction back, in order, with how the run log names them.
HELD_BACK = {
    "not_an_item": "not an item of this run",
    "trained_on": "trained on (leak guard)",
    "unlabeled": "unlabelled (include_unlabeled is false)",
    "below_confidence": "below min_confidence",
    "duplicate": "repeated",
}


class WritebackError(PotatoError):
    """Raised when the writeback file cannot be written, or the run's bundle is gone."""


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
            reasons = [f"{held[rule]} {why}" for rule, why in HELD_BACK.items() if held.get(rule)]
            if reasons:
                text += f" ({'; '.join(reasons)})"
            parts.append(text)
        for schema, n in self.not_written_back.items():
            parts.append(f"{schema}: {n} predictions not written back (not in model_training.writeback.schemas)")
        return f"Wrote back to {self.path}: " + "; ".join(parts)

    def describe_bad_lines(self, predictions: Path) -> str | None:
        """The run log's warning about unreadable prediction lines, or None."""
        if not self.bad_lines:
            return None
        more = self.bad_lines - len(self.bad_examples)
        listed = "; ".join(self.bad_examples) + (f"; and {more} more" if more else "")
        return (f"{predictions}: {self.bad_lines} prediction line(s) could not be read and were "
                f"skipped ({listed})")


def writeback_path(config: ProjectConfig) -> Path:
    return config.training_dir / "predictions.jsonl"


# How _write spells each prediction's run (json.dumps' default separators). In a JSON string a
# quote is escaped, so '"run_id": ' followed by a digit can only be that key.
_RUN_ID = re.compile(rb'"run_id": (\d+)')


def live_run_ids(config: ProjectConfig) -> set[int]:
    """The runs whose predictions the writeback file holds now (what annotators see pre-filled)."""
    try:
        data = writeback_path(config).read_bytes()
    except FileNotFoundError:
        return set()
    return {int(found) for found in set(_RUN_ID.findall(data))}


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    # errors="replace": a stray byte is one bad line, not a crash of the whole writeback.
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line_no, line in enumerate(fh, start=1):
            if line.strip():
                yield line_no, line


def _is_confidence(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and 0 <= value <= 1)


def parse_prediction(line: str, labels: dict[str, Sequence[str]]) -> tuple[str, str, str, float]:
    """``(id, schema, label, confidence)`` of one line of a run's predictions; ValueError says why not.

    *labels* maps each schema of the run to its labels.
    """
    try:
        record = json.loads(line)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, not an object")
    item_id, schema, label = record.get("id"), record.get("schema"), record.get("label")
    confidence = record.get("confidence")
    if not isinstance(item_id, str) or not item_id:
        raise ValueError(f"id is {quote(item_id)}, not an item id")
    if schema not in labels:
        raise ValueError(f"schema is {quote(schema)}, not a schema of this run")
    if label not in labels[schema]:
        raise ValueError(f"label is {quote(label)}, not a label of {schema!r}")
    if not _is_confidence(confidence):
        raise ValueError(f"confidence is {quote(confidence)}, not a number from 0 to 1")
    return item_id, schema, label, float(confidence)


class _Table:
    """Predictions per schema, in the bundle's item order: compact arrays, not a dict per item."""

    def __init__(self, n_items: int, labels: dict[str, Sequence[str]]):
        self.n = n_items
        self.labels = labels  # schema -> its labels: a prediction is stored as its label's index
        self._index = {schema: {label: i for i, label in enumerate(names)} for schema, names in labels.items()}
        self.columns: dict[str, tuple[array, array, array]] = {}

    def put(self, schema: str, index: int, label: str, confidence: float, run_id: int) -> None:
        """Store a prediction; ValueError when *label* is not (or no longer) a label of *schema*."""
        if schema not in self.columns:
            self.columns[schema] = (array("l", [-1]) * self.n, array("d", [0.0]) * self.n,
                                    array("q", [0]) * self.n)
        labels, confidences, runs = self.columns[schema]
        if label not in self._index[schema]:
            raise ValueError(f"{label!r} is not a label of {schema!r}")
        labels[index] = self._index[schema][label]
        confidences[index], runs[index] = confidence, run_id

    def has(self, schema: str, index: int) -> bool:
        return schema in self.columns and self.columns[schema][0][index] >= 0

    def records(self, ids: Sequence[str]) -> Iterator[tuple[str, dict[str, dict]]]:
        """``(id, {schema: prediction})`` for each item with a prediction, in item order."""
        columns = list(self.columns.items())
        for index, item_id in enumerate(ids):
            predictions = {}
            for schema, (labels, confidences, runs) in columns:
                if labels[index] >= 0:
                    predictions[schema] = {"label": self.labels[schema][labels[index]],
                                           "confidence": confidences[index], "run_id": runs[index]}
            if predictions:
                yield item_id, predictions


class _Bundle:
    """What the server's own copy of the run's bundle says about each item, one flag byte per item."""

    LABELLED, TRAINED = 1, 2

    def __init__(self, bundle_dir: Path, trained_on: Mapping[str, set[str]] | None = None):
        try:
            manifest = json.loads((bundle_dir / "manifest.json").read_text(encoding="utf-8"))
            self.labels: dict[str, list[str]] = manifest["schemas"]
            self.ids: list[str] = []
            self.index: dict[str, int] = {}
            self.flags: dict[str, bytearray] = {schema: bytearray() for schema in self.labels}
            with open(bundle_dir / "items.jsonl", encoding="utf-8") as fh:
                for n, line in enumerate(fh):
                    item = json.loads(line)
                    self.index[item["id"]] = n
                    self.ids.append(item["id"])
                    labels = item.get("labels") or {}
                    for schema, flags in self.flags.items():
                        labelled = schema in labels
                        trained = (labelled and not item.get("holdout")) if trained_on is None \
                            else item["id"] in trained_on.get(schema, ())
                        flags.append((labelled or trained) * self.LABELLED | trained * self.TRAINED)
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
            for schema, prediction in predictions.items():
                if schema in keep and _is_confidence(prediction.get("confidence")):
                    table.put(schema, index, prediction["label"], float(prediction["confidence"]),
                              _run_id(prediction.get("run_id")))
        except (ValueError, KeyError, TypeError, AttributeError):
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
    summary = WritebackSummary(path=target, schemas=written_schemas)
    if not written_schemas or not predictions.is_file():
        return summary
    bundle = _Bundle(bundle_dir, trained_on)
    # Earlier runs' schemas are not in this run's bundle: their labels come from the config.
    labels = {s.name: s.labels for s in config.schemes if s.name in wb.schemas} | bundle.labels
    table = _Table(len(bundle.ids), labels)
    _read_earlier(target, wb.field, set(wb.schemas) - set(written_schemas), bundle, table)

    for line_no, line in _lines(predictions):
        try:
            item_id, schema, label, confidence = parse_prediction(line, bundle.labels)
        except ValueError as exc:
            summary.bad(line_no, str(exc))
            continue
        if schema not in written_schemas:
            summary.not_written_back[schema] = summary.not_written_back.get(schema, 0) + 1
            continue
        index = bundle.index.get(item_id)
        if index is None:
            summary.hold(schema, "not_an_item")
        elif bundle.has(bundle.TRAINED, schema, index):
            summary.hold(schema, "trained_on")
        elif not wb.include_unlabeled and not bundle.has(bundle.LABELLED, schema, index):
            summary.hold(schema, "unlabeled")
        elif confidence < wb.min_confidence:
            summary.hold(schema, "below_confidence")
        elif table.has(schema, index):
            summary.hold(schema, "duplicate")
        else:
            table.put(schema, index, label, confidence, run_id)
            summary.written[schema] = summary.written.get(schema, 0) + 1

    _write(target, wb.field, bundle, table)
    return summary


def _write(target: Path, field_name: str, bundle: _Bundle, table: _Table) -> None:
    """One record per item with a prediction, in item order; replaced atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open_text(tmp) as out:
            for item_id, predictions in table.records(bundle.ids):
                out.write(json.dumps({"id": item_id, field_name: predictions}, ensure_ascii=False) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        raise WritebackError(f"Could not write the predictions to {target}: {exc.strerror or exc}") from exc
    finally:
        if tmp.exists():
            tmp.unlink()
