"""A run's holdout evaluation, kept beside the run after its bundle is gone.

Written at record results for every run, whatever the backend (predictions
reach the server from all of them), from two sources trusted differently:
the server's own bundle says which items were labelled, their gold labels and
which were held out (never what the worker reports), and the run's
predictions say what the model answered — checked where they enter, as the
writeback checks them (``potato.writeback.parse_prediction``), and ``probs``
kept only as a list of the schema's length of numbers from 0 to 1.

Files in ``runs/<id>/``:

- ``labels.jsonl`` — one line per labelled item and schema of the run, in
  item order: ``{"id", "schema", "gold", "holdout"}``; a held-out line adds
  the prediction: ``"label"``, ``"confidence"`` and, when the worker sent
  them, ``"probs"`` (the schema's labels' order). The bundle is deleted at
  clean-up; this is what outlives it. ``decision-calibrate`` fits on the
  held-out lines, and rewrites the writeback without prelabelling an item the
  run trained on (``holdout: false``), whatever the labels say by then.
- ``evaluation.json`` — per schema: its labels, the confusion matrix (rows
  gold, columns predicted), the reliability bins (``potato.training.calibration``)
  and ECE: what the run page draws. ``decision-calibrate`` adds
  ``"calibration"`` to a schema (before and after).

``model_training.retain_runs`` deletes both with the run's directory.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

from potato.project import dump_line, load_line
from potato.training.calibration import expected_calibration_error, reliability_bins
from potato.writeback import parse_prediction

FORMAT = 1
LABELS_FILE = "labels.jsonl"
EVALUATION_FILE = "evaluation.json"
BINS = 10


def _bundle_items(bundle_dir: Path) -> Iterator[dict[str, Any]]:
    with open(bundle_dir / "items.jsonl", "rb") as fh:
        for line in fh:
            if line.strip():
                yield load_line(line)


def _probs(value: Any, n_labels: int) -> list[float] | None:
    if not isinstance(value, list) or len(value) != n_labels:
        return None
    for p in value:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (math.isfinite(p) and 0 <= p <= 1):
            return None
    return [float(p) for p in value]


def _holdout_predictions(predictions: Path, labels: dict[str, Sequence[str]],
                         held: dict[str, set[str]]) -> dict[tuple[str, str], tuple[str, float, list | None]]:
    """``(schema, id) -> (label, confidence, probs)`` of the held-out items; unreadable lines skipped."""
    found: dict[tuple[str, str], tuple[str, float, list | None]] = {}
    if not predictions.is_file():
        return found
    with open(predictions, "rb") as fh:
        for line in fh:
            try:
                record = load_line(line)
                if record.get("id") not in held.get(record.get("schema"), ()):
                    continue
                item_id, schema, label, confidence = parse_prediction(line.decode("utf-8"), labels)
            except (ValueError, AttributeError, TypeError):
                continue  # the writeback names bad lines in the run log
            found.setdefault((schema, item_id), (label, confidence,
                                                 _probs(record.get("probs"), len(labels[schema]))))
    return found


def record_evaluation(run_id: int, run_dir: Path, bundle_dir: Path, schemas: Sequence[str]) -> dict[str, Any]:
    """Write ``labels.jsonl`` and ``evaluation.json`` for the run's *schemas*; return the evaluation."""
    manifest = json.loads((bundle_dir / "manifest.json").read_text(encoding="utf-8"))
    labels = {s: list(manifest["schemas"][s]) for s in schemas if s in manifest.get("schemas", {})}
    held: dict[str, set[str]] = {s: set() for s in labels}
    for item in _bundle_items(bundle_dir):
        if item.get("holdout"):
            for schema in item.get("labels") or {}:
                if schema in held:
                    held[schema].add(item["id"])
    predicted = _holdout_predictions(run_dir / "predictions.jsonl", labels, held)

    index = {s: {label: i for i, label in enumerate(names)} for s, names in labels.items()}
    confusion = {s: [[0] * len(names) for _ in names] for s, names in labels.items()}
    outcomes: dict[str, tuple[list[float], list[bool]]] = {s: ([], []) for s in labels}
    missing = dict.fromkeys(labels, 0)
    tmp = run_dir / f".{LABELS_FILE}.tmp"
    with open(tmp, "wb") as out:
        for item in _bundle_items(bundle_dir):
            for schema, gold in (item.get("labels") or {}).items():
                if schema not in labels:
                    continue
                line = {"id": item["id"], "schema": schema, "gold": gold, "holdout": bool(item.get("holdout"))}
                if line["holdout"]:
                    prediction = predicted.get((schema, item["id"]))
                    if prediction is None:
                        missing[schema] += 1
                    else:
                        label, confidence, probs = prediction
                        line.update(label=label, confidence=confidence)
                        if probs is not None:
                            line["probs"] = probs
                        confusion[schema][index[schema][gold]][index[schema][label]] += 1
                        outcomes[schema][0].append(confidence)
                        outcomes[schema][1].append(label == gold)
                out.write(dump_line(line))
    os.replace(tmp, run_dir / LABELS_FILE)

    evaluation = {"format": FORMAT, "run_id": run_id, "schemas": {}}
    for schema, names in labels.items():
        confidences, correct = outcomes[schema]
        ece = expected_calibration_error(confidences, correct, BINS)
        evaluation["schemas"][schema] = {
            "labels": names,
            "n": len(confidences),
            "missing": missing[schema],
            "accuracy": round(sum(correct) / len(correct), 4) if correct else None,
            "confusion": confusion[schema],
            "reliability": reliability_bins(confidences, correct, BINS),
            "ece": None if ece is None else round(ece, 4),
        }
    write_evaluation(run_dir, evaluation)
    return evaluation


def write_evaluation(run_dir: Path, evaluation: dict[str, Any]) -> None:
    tmp = run_dir / f".{EVALUATION_FILE}.tmp"
    tmp.write_text(json.dumps(evaluation, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / EVALUATION_FILE)


def read_evaluation(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``evaluation.json``, or None (no holdout evaluation, or its directory is gone)."""
    try:
        return json.loads((run_dir / EVALUATION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def trained_on(run_dir: Path, schemas: Sequence[str]) -> dict[str, set[str]]:
    """The ids whose label the run trained on (``holdout: false`` in its ``labels.jsonl``), per schema."""
    found: dict[str, set[str]] = {s: set() for s in schemas}
    with open(run_dir / LABELS_FILE, "rb") as fh:
        for line in fh:
            record = load_line(line)
            if record["schema"] in found and not record["holdout"]:
                found[record["schema"]].add(record["id"])
    return found
