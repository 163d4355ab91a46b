"""decision-calibrate on the server: which earlier run it calibrates, and the rewrite afterwards.

The trainer (``potato.training.trainers.decision_calibrate``) runs in the worker like
any other; the server does the two things only it can, as the trainer's
server-side hooks (its declaration in ``potato.training.trainers.registry``), at the
flow's usual steps:

- ``prepare`` (build bundle): choose the run — the ``run`` option, else the
  newest succeeded run of another trainer that trained every chosen schema —
  and put its holdout evaluation (``labels.jsonl``, ``potato.results.evaluation``) and
  its predictions into the bundle under ``calibrate/``, as hard links
  (nothing is copied; both files are only ever replaced, never written in
  place). A run calibrated before gives its worker's original predictions
  (``predictions.uncalibrated.jsonl``), so calibrations never compound.
- ``apply`` (record results, in place of the usual evaluation and writeback): for each schema whose calibration was kept,
  that run's ``predictions.jsonl`` gets the recalibrated lines (the worker's
  original stays as ``predictions.uncalibrated.jsonl``, so it is always
  recoverable), and the writeback is rewritten through ``potato.results.writeback``
  (its one writer) under that run's id, its leak guard fed by that run's own
  ``labels.jsonl``. Its ``evaluation.json`` (and this run's) gains the
  calibration: before and after, kept or not and why. A schema a newer run
  has trained since keeps that run's writeback; one the quality gate held
  back of that run (``potato.results.quality_gate``) stays held back: promote the
  run to show it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from potato.backends.base import RunContext
from potato.errors import CalibrationError
from potato.results import quality_gate
from potato.results.evaluation import read_evaluation, trained_on, write_evaluation
from potato.results.live_writeback import publish
from potato.results.record_results import log_live
from potato.runs.paths import RunPaths, run_paths
from potato.runs.store import SUCCEEDED, Run, Store
from potato.training import atomic_files, job_paths
from potato.training.trainers.decision_calibrate import NAME, SOURCE_DIR, SOURCE_FILE


def _why_not(run: Run, schemas: list[str]) -> str | None:
    if run.trainer == NAME:
        return "it is a decision-calibrate run itself"
    if run.retracted_at is not None:
        return "its predictions were retracted"
    if run.state != SUCCEEDED:
        return f"it {run.state}" if run.state in ("failed", "cancelled") else f"it is {run.state}"
    missing = [s for s in schemas if s not in run.schemas]
    if missing:
        return f"it did not train {', '.join(missing)}"
    return None


def choose_source(store: Store, schemas: list[str], wanted: int | None, config) -> Run:
    """The run to calibrate (module docstring); raises ``CalibrationError``."""
    if wanted is not None:
        run = store.get_run(wanted)
        why = _why_not(run, schemas)
        if why:
            raise CalibrationError(f"Run {wanted} cannot be calibrated: {why}")
    else:
        run = next((r for r in store.list_runs() if _why_not(r, schemas) is None), None)
        if run is None:
            raise CalibrationError(
                f"decision-calibrate needs a succeeded training run of {', '.join(schemas)} to calibrate, and "
                "there is none yet: train one first")
    paths = run_paths(config, run.id)
    evaluation = read_evaluation(paths.dir)
    if evaluation is None or not paths.labels.is_file() or not _predictions(paths).is_file():
        raise CalibrationError(
            f"Run {run.id} has no holdout evaluation to calibrate with: its directory was deleted "
            "(model_training.retain_runs) or it finished before Potato kept one; train a new run and "
            "calibrate that")
    return run


def _predictions(paths: RunPaths) -> Path:
    """The run's predictions as its worker made them (decision-calibrate may have rewritten the others)."""
    original = paths.uncalibrated_predictions
    return original if original.is_file() else paths.predictions


def _link(source: Path, target: Path) -> None:
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another file system, or no hard links there
        shutil.copyfile(source, target)


def prepare(ctx: RunContext) -> Run:
    """Put the chosen run's holdout evaluation and predictions into this run's bundle."""
    schemas = list(ctx.run.schemas)
    source = choose_source(ctx.store, schemas, (ctx.run.options or {}).get("run"), ctx.config)
    paths = run_paths(ctx.config, source.id)
    evaluation = read_evaluation(paths.dir)
    target = ctx.bundle_dir / SOURCE_DIR
    target.mkdir(parents=True, exist_ok=True)
    _link(paths.labels, target / job_paths.LABELS)
    _link(_predictions(paths), target / job_paths.PREDICTIONS)
    labels = {s: evaluation["schemas"][s]["labels"] for s in schemas if s in evaluation["schemas"]}
    (target / SOURCE_FILE).write_text(json.dumps({"run_id": source.id, "schemas": labels}), encoding="utf-8")
    ctx.log.info(f"Calibrating run {source.id} ({source.trainer}, finished "
                 f"{_when(source.finished_at)}) for {', '.join(schemas)}")
    return source


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "at an unknown time"


def apply(ctx: RunContext) -> None:
    """Rewrite the calibrated run's predictions, evaluation and writeback (module docstring)."""
    # The run prepare() put into the bundle, which is removed only at clean-up, after this.
    source_id = json.loads((ctx.bundle_dir / SOURCE_DIR / SOURCE_FILE).read_text(encoding="utf-8"))["run_id"]
    result = json.loads((ctx.artifacts_dir / "calibration.json").read_text(encoding="utf-8"))
    if result.get("run_id") != source_id:
        raise CalibrationError(f"The worker calibrated run {result.get('run_id')!r}, not run {source_id}")
    paths = run_paths(ctx.config, source_id)
    schemas: dict[str, Any] = result["schemas"]

    evaluation = read_evaluation(paths.dir) or {"format": 1, "run_id": source_id, "schemas": {}}
    for schema, outcome in schemas.items():
        entry = {key: value for key, value in outcome.items() if key != "reliability_before"}
        entry.update(by_run=ctx.run_id, target_precision=result.get("target_precision"))
        evaluation["schemas"].setdefault(schema, {})["calibration"] = entry
    write_evaluation(paths.dir, evaluation)
    write_evaluation(ctx.run_dir, evaluation)

    kept = [schema for schema, outcome in schemas.items() if outcome.get("kept")]
    if not kept:
        ctx.log.info(f"Nothing was calibrated: run {source_id}'s predictions and the writeback stay as they were")
        return
    _rewrite_predictions(paths, ctx.paths.predictions, set(kept))
    ctx.log.info(f"Run {source_id}'s predictions of {', '.join(kept)} now carry calibrated confidences; its "
                 f"worker's original predictions are {paths.uncalibrated_predictions}")

    newer = {s: r.id for r in ctx.store.list_runs() if r.id > source_id and _why_not(r, []) is None
             for s in r.schemas if s in kept}
    for schema, run_id in sorted(newer.items()):
        ctx.log.info(f"Writeback of {schema} left as it is: it holds run {run_id}'s newer predictions")
    held = {v["schema"]: v["text"] for v in quality_gate.held_back(paths)}
    for schema in sorted(held.keys() & set(kept) - newer.keys()):
        ctx.log.info(f"Writeback of {schema} left as it is: the quality gate held run {source_id}'s predictions "
                     f"back ({held[schema]})")
    written = [s for s in kept if s not in newer and s not in held]
    if not written:
        return
    summary, live = publish(ctx.config, source_id, written, paths.predictions, ctx.bundle_dir,
                            trained_on=trained_on(paths.dir, written))
    ctx.log.info(summary.describe())
    log_live(ctx.log, live)


def _rewrite_predictions(paths: RunPaths, calibrated: Path, kept: set[str]) -> None:
    """The run's predictions with the *kept* schemas' lines taken from *calibrated*; the original kept once."""
    current = paths.predictions
    if not paths.uncalibrated_predictions.exists():
        _link(current, paths.uncalibrated_predictions)
    with atomic_files.replacing(current) as out:
        for path, take in ((current, lambda s: s not in kept), (calibrated, lambda s: s in kept)):
            with open(path, "rb") as fh:
                for line in fh:
                    try:
                        schema = json.loads(line).get("schema")
                    except (ValueError, AttributeError):
                        continue
                    if take(schema):
                        out.write(line if line.endswith(b"\n") else line + b"\n")
