"""``decision-calibrate``: make an earlier run's confidences mean what they say, if that can be shown.

It trains nothing. Its bundle carries an earlier run's holdout evaluation and
predictions (the server put them under ``calibrate/``: ``source.json``,
``labels.jsonl``, ``predictions.jsonl``; ``potato/trainer_hooks/decision_calibrate.py``). Per
schema it fits a calibration map to the held-out items (a temperature; Platt
on small holdouts — ``potato.training.calibration``), judges it out of fold,
and **keeps it only if it lowers both the holdout log-loss and the expected
calibration error**; the run log says which, with the numbers, either way.

It writes, like any trainer: ``predictions.jsonl`` — the earlier run's
predictions of the chosen schemas, confidences (and ``probs``) recalibrated
where the map was kept, as they were where it was not; ``scores.json`` — per
schema ECE and log-loss before and after, whether the map was kept, and the
confidence threshold that gives ``target_precision`` on the holdout; and
``artifacts/calibration.json`` — the maps and reliability bins before and
after, for the run page. The server then rewrites the earlier run's
predictions and the writeback (``potato/trainer_hooks/decision_calibrate.py``).

Pure Python: it needs no torch and takes seconds. It runs only on the local
backend (its declaration in ``potato.training.trainers.registry``): the files it reads and the
ones the server rewrites live on the annotation server.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

from potato.training.trainers.options import check_keys, is_int, is_number
from potato.training.trainers.registry import TRAINERS
from potato.training import calibration as cal
from potato.training import job_paths
from potato.training import atomic_files
from potato.training.events import TrainerFailure

NAME = "decision-calibrate"
REQUIRED_MODULES = TRAINERS[NAME].required_modules
USES_DEVICE = TRAINERS[NAME].uses_device  # False: the worker chooses no torch device for it, so it never imports torch

DEFAULT_OPTIONS = {
    "run": None,  # the run to calibrate; None: the newest succeeded run that trained the schemas
    "method": "auto",  # "auto" (temperature; Platt below calibration.SMALL_HOLDOUT items), "temperature", "platt"
    "bins": 10,
    "folds": 5,
    "target_precision": 0.9,
}  # type: Dict[str, Any]

SOURCE_DIR = "calibrate"  # in the bundle: SOURCE_FILE, and the earlier run's labels.jsonl and predictions.jsonl
SOURCE_FILE = "source.json"  # {"run_id": the earlier run, "schemas": {schema: its labels}}


def check_options(options: Optional[Dict[str, Any]]) -> List[str]:
    """Problems with ``options`` as texts naming the key (empty when all is well)."""
    options, problems = check_keys(options, DEFAULT_OPTIONS, NAME)
    run = options.get("run")
    if run is not None and not (is_int(run) and run > 0):
        problems.append("run must be a run id (a positive integer), got {!r}".format(run))
    if options.get("method", "auto") not in ("auto", "temperature", "platt"):
        problems.append("method must be auto, temperature or platt, got {!r}".format(options["method"]))
    for key, low in (("bins", 2), ("folds", 2)):
        if key in options and not (is_int(options[key]) and low <= options[key] <= 100):
            problems.append("{} must be an integer from {} to 100, got {!r}".format(key, low, options[key]))
    target = options.get("target_precision", 0.9)
    if not (is_number(target) and 0 < target < 1):
        problems.append("target_precision must be a number between 0 and 1, got {!r}".format(target))
    return problems


def _read_jsonl(path: str) -> List[Dict[str, Any]]:
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError as exc:
                    raise TrainerFailure("{} line {} is not valid JSON: {}".format(path, number, exc))
    return records


def _r(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 4)


def calibrate_schema(rows: List[Dict[str, Any]], n_labels: int, opts: Dict[str, Any]) -> Dict[str, Any]:
    """Fit, judge and describe one schema's calibration from its holdout rows.

    Each row: ``confidence``, ``correct``, ``gold_prob`` (None when unknown).
    Returns the scores, the map (identity when not kept), the bins and why.
    """
    bins, n = opts["bins"], len(rows)
    conf = [r["confidence"] for r in rows]
    correct = [r["correct"] for r in rows]
    gold = [r["gold_prob"] for r in rows]
    method = cal.choose_method(n, opts["method"])
    before = {"ece": cal.expected_calibration_error(conf, correct, bins),
              "log_loss": cal.log_loss(conf, correct, conf, gold, n_labels)}
    result = {"n": n, "method": method, "kept": False, "map": cal.CalibrationMap().as_dict(),
              "ece_before": _r(before["ece"]), "log_loss_before": _r(before["log_loss"]),
              "ece_after": None, "log_loss_after": None,
              "reliability_before": cal.reliability_bins(conf, correct, bins), "reliability_after": None}
    if n < cal.MIN_HOLDOUT:
        result["reason"] = ("only {} held-out item(s); at least {} are needed to judge a calibration, so the "
                            "confidences stay as they are".format(n, cal.MIN_HOLDOUT))
        final = conf
    else:
        oof = cal.out_of_fold(conf, correct, method, opts["folds"])
        after = {"ece": cal.expected_calibration_error(oof, correct, bins),
                 "log_loss": cal.log_loss(oof, correct, conf, gold, n_labels)}
        result.update(ece_after=_r(after["ece"]), log_loss_after=_r(after["log_loss"]),
                      reliability_after=cal.reliability_bins(oof, correct, bins))
        numbers = "log-loss {:.4f} -> {:.4f}, ECE {:.4f} -> {:.4f} (out of fold, {} folds)".format(
            before["log_loss"], after["log_loss"], before["ece"], after["ece"], min(opts["folds"], n))
        if after["log_loss"] < before["log_loss"] and after["ece"] < before["ece"]:
            mapping = cal.fit(conf, correct, method)
            result.update(kept=True, map=mapping.as_dict(), reason="it lowered holdout " + numbers)
            final = [mapping(c) for c in conf]
        else:
            worse = [name for name in ("log_loss", "ece") if after[name] >= before[name]]
            result["reason"] = "it did not lower holdout {} ({}), so the confidences stay as they are".format(
                " or ".join(w.replace("_", "-") if w == "log_loss" else "ECE" for w in worse), numbers)
            final = conf
    threshold, coverage = cal.threshold_for_precision(final, correct, opts["target_precision"])
    result.update(threshold=_r(threshold), threshold_coverage=_r(coverage))
    return result


def describe(schema: str, result: Dict[str, Any], target: float) -> str:
    """The run log's line for one schema."""
    where = "; {:.0%} precision at confidence >= {} ({:.0%} of held-out items)".format(
        target, result["threshold"], result["threshold_coverage"]) if result["threshold"] is not None else \
        "; no confidence threshold gives {:.0%} precision on the holdout".format(target)
    if result["kept"]:
        m = result["map"]
        what = "temperature {:.3f}".format(m["temperature"]) if m.get("temperature") else \
            "Platt a={:.3f} b={:.3f}".format(m["a"], m["b"])
        return "Schema {!r}: calibration kept ({}, {} held-out items): {}{}".format(
            schema, what, result["n"], result["reason"], where)
    return "Schema {!r}: calibration backed out ({}, {} held-out items): {}{}".format(
        schema, result["method"], result["n"], result["reason"], where)


def train(job: Any, events: Any) -> None:
    """Calibrate the earlier run in the bundle's ``calibrate/`` for the job's schemas."""
    opts = dict(DEFAULT_OPTIONS)
    opts.update(job.options or {})
    source_dir = os.path.join(job.bundle_dir, SOURCE_DIR)
    try:
        with open(os.path.join(source_dir, SOURCE_FILE), encoding="utf-8") as f:
            source = json.load(f)
    except (OSError, ValueError) as exc:
        raise TrainerFailure("The bundle carries no earlier run to calibrate ({})".format(exc))
    labels_of = source["schemas"]  # schema -> its labels, in the earlier run's order
    schemas = job.schemas or list(labels_of)
    events.log("Calibrating run {}'s confidences for {}".format(source["run_id"], ", ".join(schemas)))

    rows = {schema: [] for schema in schemas}  # type: Dict[str, List[Dict[str, Any]]]
    for record in _read_jsonl(os.path.join(source_dir, job_paths.LABELS)):
        schema = record.get("schema")
        if schema in rows and record.get("holdout") and isinstance(record.get("confidence"), (int, float)):
            probs = record.get("probs")
            labels = labels_of[schema]
            gold_prob = None
            if isinstance(probs, list) and len(probs) == len(labels) and record.get("gold") in labels:
                gold_prob = probs[labels.index(record["gold"])]
            rows[schema].append({"confidence": float(record["confidence"]),
                                 "correct": record.get("label") == record.get("gold"), "gold_prob": gold_prob})

    results = {}
    for schema in schemas:
        events.check_cancelled()
        results[schema] = calibrate_schema(rows[schema], len(labels_of[schema]), opts)
        events.log(describe(schema, results[schema], opts["target_precision"]),
                   level="info" if results[schema]["kept"] else "warning")

    maps = {s: cal.CalibrationMap(r["map"]["a"], r["map"]["b"], r["map"]["method"])
            for s, r in results.items() if r["kept"]}
    predictions = []
    for record in _read_jsonl(os.path.join(source_dir, job_paths.PREDICTIONS)):
        schema = record.get("schema")
        if schema not in results:
            continue
        mapping = maps.get(schema)
        if mapping is not None and isinstance(record.get("confidence"), (int, float)):
            raw = float(record["confidence"])
            new = mapping(raw)
            record["confidence"] = round(new, 5)
            probs = record.get("probs")
            if isinstance(probs, list) and probs:
                record["probs"] = [round(p, 5) for p in cal.with_top(probs, new)]
        predictions.append(record)
    job.write_predictions(predictions)

    scores = {s: {key: r[key] for key in ("n", "method", "kept", "ece_before", "ece_after", "log_loss_before",
                                          "log_loss_after", "threshold", "threshold_coverage")}
              for s, r in results.items()}
    for s in scores:
        scores[s]["target_precision"] = opts["target_precision"]
        scores[s]["calibrated_run"] = source["run_id"]
    os.makedirs(job.artifacts_dir, exist_ok=True)
    atomic_files.write_text(os.path.join(job.artifacts_dir, "calibration.json"),
                 json.dumps({"run_id": source["run_id"], "calibrated_by": job.run_id,
                             "target_precision": opts["target_precision"], "schemas": results}, indent=1) + "\n")
    job.write_scores(scores)
    events.metrics(scores)
