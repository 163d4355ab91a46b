"""The flow's record-results step: what the run log says, and that a bad prediction never fails a run."""

from __future__ import annotations

import json
from dataclasses import replace

from prefect.logging import disable_run_logger

from flows.training_run import record_results_task
from potato.runs.paths import open_store, run_paths
from potato.runs.queue import create_run
from potato.config import WritebackConfig
from potato.project import build_bundle
from potato.runlog import RunLog
from potato.backends.base import RunContext
from tests.support.potato_project import make_project, project_config


def test_a_bad_prediction_line_does_not_fail_the_run(tmp_path):
    """A non-numeric confidence once failed the run with "Internal error" and left a .tmp file."""
    config = project_config(make_project(tmp_path, n_items=10, labeled_fraction=0.0), holdout_fraction=0.0)
    config = replace(config, model_training=replace(
        config.model_training, writeback=WritebackConfig(schemas=("sentiment",), include_unlabeled=True)))
    store = open_store(config)
    run = create_run(config, store, schemas=["sentiment"])
    ctx = RunContext(config, store, run, config.model_training.backends["local"],
                     RunLog(store, run.id, run_paths(config, run.id).dir / "run.log", mirror_to_prefect=False))
    build_bundle(config, ["sentiment"], ctx.bundle_dir)
    (ctx.run_dir / "predictions.jsonl").write_text(
        json.dumps({"id": "r9", "schema": "sentiment", "label": "positive", "confidence": 0.9}) + "\n"
        + json.dumps({"id": "r8", "schema": "sentiment", "label": "positive", "confidence": "high"}) + "\n")

    with disable_run_logger():
        record_results_task.fn(ctx)

    written = (config.training_dir / "predictions.jsonl").read_text().splitlines()
    assert written == ['{"id": "r9", "predictions": {"sentiment": {"label": "positive", "confidence": 0.9, "run_id": 1}}}']
    assert not [p for p in config.training_dir.rglob("*") if p.name.endswith(".tmp")]
    log = (ctx.run_dir / "run.log").read_text()
    assert ("1 prediction line(s) could not be read and were skipped (line 2: confidence is 'high'; "
            "use a number from 0 to 1)") in log
    assert f"Wrote back to {config.training_dir / 'predictions.jsonl'}: sentiment: 1 predictions" in log
