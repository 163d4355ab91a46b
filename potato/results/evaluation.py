"""A run's holdout evaluation, kept beside the run after its bundle is gone.

Written at record results for every run, whatever the backend (predictions
reach the server from all of them), from two sources trusted differently:
the server's own bundle says which items were labelled, their gold labels and
which were held out (never what the worker reports), and the run's
predictions say what the model answered — checked where they enter, as the
writeback checks them (``potato.prefill.prediction_shapes.parse_prediction``), and
``probs`` kept only as a list of the schema's length of numbers from 0 to 1.

Files in ``runs/<id>/``:

- ``labels.jsonl`` — one line per labelled item and schema of the run, in
  item order: ``{"id", "schema", "gold", "holdout"}`` (``gold`` as the
  bundle holds it: a label, a set, a number, spans, texts); a held-out line
  adds the prediction: ``"label"`` (a label or a set), ``"confidence"`` and,
  when the worker sent them, ``"probs"`` (the schema's labels' order); or
  ``"value"``, ``"spans"``, ``"text"``. The bundle is deleted at
  clean-up; this is what outlives it. ``decision-calibrate`` fits on the
  held-out lines, and rewrites the writeback without prelabelling an item the
  run trained on (``holdout: false``), whatever the labels say by then.
- ``evaluation.json`` — per schema, what the run page draws. A label schema
  (nominal, ordinal): its labels, the confusion matrix (rows gold, columns
  predicted), the reliability bins (``potato.training.calibration``) and ECE;
  ``decision-calibrate`` adds ``"calibration"`` (before and after). Other
  kinds say ``"kind"`` and their own picture: multilabel a 2×2 confusion
  per label (``per_label``: ``tp``, ``fp``, ``fn``, ``tn``) and the share of
  exact sets; span the exact-match counts per label (``tp``, ``fp``,
  ``fn``); continuous the mean absolute error; text the share of exact
  answers; comparison the agreement with the majority's side (items whose
  majority is a tie left out) and with each annotator, and the reliability
  of the preference probabilities against the majority; best_worst the
  same for the predicted best of each tuple, and the agreement on its worst.

``model_training.retain_runs`` deletes both with the run's directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Sequence

from potato.items.json_lines import dump_line, load_line
from potato.prefill.prediction_shapes import Prediction, parse_prediction
from potato.runs.paths import RunPaths
from potato.training import atomic_files
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
    TIE,
    WORST,
    borda_order,
    majority_side,
    most_picked,
)
from potato.training.calibration import expected_calibration_error, reliability_bins
from potato.training.trainers import metrics

FORMAT = 1
BINS = 10


def _bundle_items(bundle_dir: Path) -> Iterator[dict[str, Any]]:
    with open(bundle_dir / "items.jsonl", "rb") as fh:
        for line in fh:
            if line.strip():
                yield load_line(line)


def _holdout_predictions(predictions: Path, kinds: dict[str, str], labels: dict[str, Sequence[str]],
                         held: dict[str, set[str]]) -> dict[tuple[str, str], Prediction]:
    """``(schema, id) -> prediction`` of the held-out items; unreadable lines skipped."""
    found: dict[tuple[str, str], Prediction] = {}
    if not predictions.is_file():
        return found
    with open(predictions, "rb") as fh:
        for line in fh:
            try:
                record = load_line(line)
                if record.get("id") not in held.get(record.get("schema"), ()):
                    continue
                prediction = parse_prediction(record, kinds, labels)
            except (ValueError, AttributeError, TypeError):
                continue  # the writeback names bad lines in the run log
            found.setdefault((prediction.schema, prediction.item_id), prediction)
    return found



def _prediction_fields(prediction: Prediction) -> dict[str, Any]:
    """What a held-out line of labels.jsonl keeps of the prediction."""
    field = {CONTINUOUS: "value", SPAN: "spans", TEXT: "text", RANKING: "order"}.get(prediction.kind, "label")
    out: dict[str, Any] = {field: prediction.answer}
    if prediction.confidence is not None:
        out["confidence"] = prediction.confidence
    if prediction.probs is not None:
        out["probs"] = prediction.probs
    return out


class _Picture:
    """One schema's evaluation, added to held-out item by item."""

    def __init__(self, kind: str, labels: Sequence[str]):
        self.kind, self.labels = kind, list(labels)
        self.index = {label: i for i, label in enumerate(labels)}
        self.n = self.missing = 0
        self.confusion = [[0] * len(labels) for _ in labels]
        self.per_label = {label: {"tp": 0, "fp": 0, "fn": 0, "tn": 0} for label in labels}
        self.confidences: list[float] = []
        self.correct: list[bool] = []
        self.errors: list[float] = []
        self.chose = self.matched = 0  # comparison: the annotators' choices of a side, and those the model's matched
        self.worst_correct: list[bool] = []  # best_worst: the tuples' worst (``correct`` holds their best)
        self.orders: list[tuple[Any, Any]] = []  # ranking: (the annotators' orders, the predicted order)

    def add(self, gold: Any, prediction: Prediction) -> None:
        self.n += 1
        answer = prediction.answer
        if self.kind in (NOMINAL, ORDINAL):
            self.confusion[self.index[gold]][self.index[answer]] += 1
            self.confidences.append(prediction.confidence)
            self.correct.append(answer == gold)
        elif self.kind == MULTILABEL:
            for label, counts in self.per_label.items():
                counts[("t" if (label in answer) == (label in gold) else "f")
                       + ("p" if label in answer else "n")] += 1
            self.correct.append(set(answer) == set(gold))
        elif self.kind == CONTINUOUS:
            self.errors.append(abs(float(answer) - float(gold)))
        elif self.kind == SPAN:
            golds = {(s["start"], s["end"], s["label"]) for s in gold}
            found = {(s["start"], s["end"], s["label"]) for s in answer}
            for label, counts in self.per_label.items():
                g = {s for s in golds if s[2] == label}
                f = {s for s in found if s[2] == label}
                counts["tp"] += len(g & f)
                counts["fp"] += len(f - g)
                counts["fn"] += len(g - f)
        elif self.kind == TEXT:
            self.correct.append(answer.strip() in {g.strip() for g in gold})
        elif self.kind == COMPARISON:
            self.chose += gold.get("A", 0) + gold.get("B", 0)
            self.matched += gold.get(answer, 0)
            if majority_side(gold) != TIE:
                self.confidences.append(prediction.confidence)
                self.correct.append(answer == majority_side(gold))
        elif self.kind == BEST_WORST:
            best, worst = gold.get(BEST, {}), gold.get(WORST, {})
            self.chose += sum(best.values()) + sum(worst.values())
            self.matched += best.get(answer[BEST], 0) + worst.get(answer[WORST], 0)
            if most_picked(best) != TIE:
                self.confidences.append(prediction.confidence)
                self.correct.append(answer[BEST] == most_picked(best))
            if most_picked(worst) != TIE:
                self.worst_correct.append(answer[WORST] == most_picked(worst))
        elif self.kind == RANKING:
            self.orders.append((gold, answer))
            top = borda_order(gold, self.labels)[1]
            if top != TIE:
                self.confidences.append(prediction.confidence)
                self.correct.append(answer[0] == top)

    def as_dict(self) -> dict[str, Any]:
        share = round(sum(self.correct) / len(self.correct), 4) if self.correct else None
        if self.kind in (NOMINAL, ORDINAL):
            ece = expected_calibration_error(self.confidences, self.correct, BINS)
            out = {"labels": self.labels, "n": self.n, "missing": self.missing, "accuracy": share,
                   "confusion": self.confusion, "reliability": reliability_bins(self.confidences, self.correct, BINS),
                   "ece": None if ece is None else round(ece, 4)}
            return out if self.kind == NOMINAL else {"kind": self.kind, **out}
        out = {"kind": self.kind, "labels": self.labels, "n": self.n, "missing": self.missing}
        if self.kind == MULTILABEL:
            out.update(exact_set=share, per_label=[{"label": label, **c} for label, c in self.per_label.items()])
        elif self.kind == SPAN:
            out["per_label"] = [{"label": label, "tp": c["tp"], "fp": c["fp"], "fn": c["fn"]}
                                for label, c in self.per_label.items()]
        elif self.kind == CONTINUOUS:
            out["mae"] = round(sum(self.errors) / len(self.errors), 4) if self.errors else None
        elif self.kind == TEXT:
            out["exact_match"] = share
        elif self.kind == COMPARISON:
            ece = expected_calibration_error(self.confidences, self.correct, BINS)
            out.update(agreement=share, decided=len(self.correct),
                       annotator_agreement=round(self.matched / self.chose, 4) if self.chose else None,
                       reliability=reliability_bins(self.confidences, self.correct, BINS),
                       ece=None if ece is None else round(ece, 4))
        elif self.kind == BEST_WORST:
            ece = expected_calibration_error(self.confidences, self.correct, BINS)
            worst = round(sum(self.worst_correct) / len(self.worst_correct), 4) if self.worst_correct else None
            out.update(best_agreement=share, worst_agreement=worst, decided=len(self.correct),
                       annotator_agreement=round(self.matched / self.chose, 4) if self.chose else None,
                       reliability=reliability_bins(self.confidences, self.correct, BINS),
                       ece=None if ece is None else round(ece, 4))
        elif self.kind == RANKING:
            ece = expected_calibration_error(self.confidences, self.correct, BINS)
            found = metrics.ranking([g for g, _ in self.orders], [a for _, a in self.orders], self.labels)
            out.update({key: round(v, 4) if isinstance(v, float) else v for key, v in found.items()},
                       reliability=reliability_bins(self.confidences, self.correct, BINS),
                       ece=None if ece is None else round(ece, 4))
        return out


def schema_answers(bundle_dir: Path, schemas: Sequence[str]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The run's *schemas*' labels and answer kinds, as the server's bundle's manifest holds them."""
    manifest = json.loads((bundle_dir / "manifest.json").read_text(encoding="utf-8"))
    labels = {s: list(manifest["schemas"][s]) for s in schemas if s in manifest.get("schemas", {})}
    answers = manifest.get("answers") or {}
    return labels, {s: (answers.get(s) or {}).get("kind", NOMINAL) for s in labels}


def record_evaluation(run_id: int, run_dir: Path, bundle_dir: Path, schemas: Sequence[str]) -> dict[str, Any]:
    """Write ``labels.jsonl`` and ``evaluation.json`` for the run's *schemas*; return the evaluation."""
    labels, kinds = schema_answers(bundle_dir, schemas)
    held: dict[str, set[str]] = {s: set() for s in labels}
    for item in _bundle_items(bundle_dir):
        if item.get("holdout"):
            for schema in item.get("labels") or {}:
                if schema in held:
                    held[schema].add(item["id"])
    paths = RunPaths(run_dir)
    predicted = _holdout_predictions(paths.predictions, kinds, labels, held)

    pictures = {s: _Picture(kinds[s], names) for s, names in labels.items()}
    with atomic_files.replacing(paths.labels) as out:
        for item in _bundle_items(bundle_dir):
            for schema, gold in (item.get("labels") or {}).items():
                if schema not in labels:
                    continue
                line = {"id": item["id"], "schema": schema, "gold": gold, "holdout": bool(item.get("holdout"))}
                if line["holdout"]:
                    prediction = predicted.get((schema, item["id"]))
                    if prediction is None:
                        pictures[schema].missing += 1
                    else:
                        line.update(_prediction_fields(prediction))
                        pictures[schema].add(gold, prediction)
                out.write(dump_line(line))  # answers may hold any string JSON carries (a lone surrogate)

    evaluation = {"format": FORMAT, "run_id": run_id,
                  "schemas": {schema: picture.as_dict() for schema, picture in pictures.items()}}
    write_evaluation(run_dir, evaluation)
    return evaluation


def write_evaluation(run_dir: Path, evaluation: dict[str, Any]) -> None:
    atomic_files.write_text(RunPaths(run_dir).evaluation, json.dumps(evaluation, indent=1) + "\n")


def read_evaluation(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``evaluation.json``, or None (no holdout evaluation, or its directory is gone)."""
    try:
        return json.loads(RunPaths(run_dir).evaluation.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def trained_on(run_dir: Path, schemas: Sequence[str]) -> dict[str, set[str]]:
    """The ids whose label the run trained on (``holdout: false`` in its ``labels.jsonl``), per schema."""
    found: dict[str, set[str]] = {s: set() for s in schemas}
    with open(RunPaths(run_dir).labels, "rb") as fh:
        for line in fh:
            record = load_line(line)
            if record["schema"] in found and not record["holdout"]:
                found[record["schema"]].add(record["id"])
    return found
