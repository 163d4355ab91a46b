"""retain_runs: older finished runs lose their directories; records, open runs, live predictions and 2.12's stay."""

from __future__ import annotations

import json
from dataclasses import replace

from potato.results.evaluation import write_evaluation
from potato.results.retention import prune_run_dirs
from potato.results.writeback import writeback_path
from potato.runs.paths import open_store, run_paths
from potato.runs.queue import create_run
from potato.training.trainers.decision_calibrate import NAME as CALIBRATE
from tests.support.potato_project import make_project, project_config


def _runs(config, *specs):
    """Runs 1, 2, … in the given states (``"succeeded"``, or ``("succeeded", trainer)``), each with a directory."""
    store = open_store(config)
    for spec in specs:
        state, trainer = (spec, None) if isinstance(spec, str) else spec
        run = create_run(config, store, trainer=trainer)
        (run_paths(config, run.id).dir / "artifacts").mkdir()
        if state != "queued":
            store.transition(run.id, state, from_states=("queued",))
    return store


def _left(config) -> list[str]:
    return sorted((p.name for p in (config.training_dir / "runs").iterdir()), key=lambda n: (len(n), n))


def _live(config, *run_ids) -> None:
    """The writeback file holds predictions of *run_ids* (one item each), as write_back writes it."""
    records = [{"id": f"r{i}", "predictions": {"sentiment": {"label": "positive", "confidence": 0.9, "run_id": run_id}}}
               for i, run_id in enumerate(run_ids)]
    writeback_path(config).write_text("".join(json.dumps(r) + "\n" for r in records))


def _config(tmp_path, keep):
    return project_config(make_project(tmp_path, n_items=3), retain_runs=keep)


def test_only_succeeded_training_runs_count_and_newer_failures_keep_their_logs(tmp_path):
    config = _config(tmp_path, 2)
    store = _runs(config, "succeeded", "failed", "running", "succeeded", "cancelled", "succeeded", "queued")
    theirs = config.training_dir / "runs" / "20261130T184053-ce61b8"  # a Potato 2.12 run directory
    theirs.mkdir()

    assert prune_run_dirs(config, store) == [1, 2]
    # 3 running, 7 queued; 4 and 6 the newest two succeeded, 5 finished after the oldest of them.
    assert _left(config) == ["3", "4", "5", "6", "7", "20261130T184053-ce61b8"]
    assert store.count_runs() == 7 and store.get_run(1).state == "succeeded"
    assert prune_run_dirs(replace(config, model_training=replace(config.model_training, retain_runs=None)),
                          store) == []


def test_two_failures_after_the_last_success_do_not_cost_its_model(tmp_path):
    config = _config(tmp_path, 2)
    store = _runs(config, "succeeded", "failed", "failed")
    _live(config, 1)
    assert prune_run_dirs(config, store) == [] and _left(config) == ["1", "2", "3"]


def test_a_run_whose_predictions_annotators_see_is_kept_however_old(tmp_path):
    config = _config(tmp_path, 1)
    store = _runs(config, "succeeded", "succeeded", "succeeded")
    _live(config, 1, 3)  # run 1's predictions of a schema no later run trained
    assert prune_run_dirs(config, store) == [2] and _left(config) == ["1", "3"]


def test_the_run_a_kept_decision_calibrate_run_calibrated_is_kept(tmp_path):
    config = _config(tmp_path, 1)
    store = _runs(config, "succeeded", ("succeeded", CALIBRATE))
    write_evaluation(run_paths(config, 2).dir, {"format": 1, "run_id": 1, "schemas": {}})
    assert prune_run_dirs(config, store) == [] and _left(config) == ["1", "2"]  # what main deleted: run 1

    newer = create_run(config, store)  # a newer training run: run 2's calibration is no longer kept
    store.transition(newer.id, "succeeded", from_states=("queued",))
    assert prune_run_dirs(config, store) == [1, 2] and _left(config) == ["3"]


def test_a_newer_calibration_keeps_the_older_run_it_calibrated(tmp_path):
    config = _config(tmp_path, 1)
    store = _runs(config, "succeeded", "succeeded", ("failed", CALIBRATE))
    store.update_run(3, options={"run": 1})  # asked for run 1; failed before it wrote an evaluation
    assert prune_run_dirs(config, store) == [] and _left(config) == ["1", "2", "3"]
