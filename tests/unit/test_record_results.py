"""Recording a run's results (``potato.results.record_results``, the flow's record-results step without Prefect)."""

from __future__ import annotations

import json
from dataclasses import replace

from potato.backends.base import RunContext
from potato.bundle.build import build_bundle
from potato.config import WritebackConfig
from potato.results.record_results import record_results
from potato.runs.paths import open_store, run_paths
from potato.runs.queue import create_run
from potato.runs.runlog import RunLog
from potato.training.trainers.registry import TRAINERS
from tests.support.potato_project import make_project, project_config

recorded = []


def record_elsewhere(ctx: RunContext) -> None:
    """A trainer's own record hook, for the test below."""
    recorded.append(ctx.run_id)


def _context(tmp_path, **run) -> RunContext:
    config = project_config(make_project(tmp_path, n_items=10, labeled_fraction=0.0), holdout_fraction=0.0)
    config = replace(config, model_training=replace(
        config.model_training, writeback=WritebackConfig(schemas=("sentiment",), include_unlabeled=True)))
    store = open_store(config)
    created = create_run(config, store, schemas=["sentiment"], **run)
    ctx = RunContext(config, store, created, config.model_training.backends["local"],
                     RunLog(store, created.id, run_paths(config, created.id).run_log, mirror_to_prefect=False))
    build_bundle(config, ["sentiment"], ctx.bundle_dir)
    return ctx


def test_a_bad_prediction_line_does_not_fail_the_run(tmp_path):
    """A non-numeric confidence once failed the run with "Internal error" and left a .tmp file."""
    ctx = _context(tmp_path)
    ctx.paths.predictions.write_text(
        json.dumps({"id": "r9", "schema": "sentiment", "label": "positive", "confidence": 0.9}) + "\n"
        + json.dumps({"id": "r8", "schema": "sentiment", "label": "positive", "confidence": "high"}) + "\n")

    assert record_results(ctx) == {}

    training_dir = ctx.config.training_dir
    written = (training_dir / "predictions.jsonl").read_text().splitlines()
    assert written == ['{"id": "r9", "predictions": {"sentiment": {"label": "positive", "confidence": 0.9, "run_id": 1}}}']
    assert not [p for p in training_dir.rglob("*") if p.name.endswith(".tmp")]
    log = ctx.paths.run_log.read_text()
    assert ("1 prediction line(s) could not be read and were skipped (line 2: confidence is 'high'; "
            "use a number from 0 to 1)") in log
    assert f"Wrote back to {training_dir / 'predictions.jsonl'}: sentiment: 1 predictions" in log


def test_a_trainers_record_hook_replaces_the_evaluation_and_the_writeback(tmp_path, monkeypatch):
    info = replace(TRAINERS["hf-text-classification"], record=f"{__name__}:record_elsewhere")
    monkeypatch.setitem(TRAINERS, info.name, info)
    ctx = _context(tmp_path)
    ctx.paths.scores.write_text(json.dumps({"sentiment": {"kind": "nominal", "n": 0}}))
    ctx.paths.predictions.write_text(json.dumps({"id": "r9", "schema": "sentiment", "label": "positive",
                                                 "confidence": 0.9}) + "\n")

    assert record_results(ctx) == {"sentiment": {"kind": "nominal", "n": 0}}

    assert recorded == [ctx.run_id] and ctx.store.get_run(ctx.run_id).scores == {"sentiment": {"kind": "nominal", "n": 0}}
    assert not (ctx.config.training_dir / "predictions.jsonl").exists() and not ctx.paths.evaluation.exists()
    assert not ctx.paths.run_log.exists()  # nor a holdout line: the trainer's worker logs its own
