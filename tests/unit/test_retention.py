"""retain_runs: older finished runs lose their directories; records, open runs and 2.12's directories stay."""

from __future__ import annotations

from dataclasses import replace

from potato.runs.paths import open_store, run_paths
from potato.runs.queue import create_run
from potato.retention import prune_run_dirs
from tests.support.potato_project import make_project, project_config


def test_only_the_newest_finished_runs_keep_their_directories(tmp_path):
    config = project_config(make_project(tmp_path, n_items=3), retain_runs=2)
    store = open_store(config)
    states = ["succeeded", "failed", "running", "succeeded", "cancelled", "queued"]  # runs 1..6
    for state in states:
        run = create_run(config, store)
        (run_paths(config, run.id).dir / "artifacts").mkdir()
        if state != "queued":
            store.transition(run.id, state, from_states=("queued",))
    theirs = config.training_dir / "runs" / "20261130T184053-ce61b8"  # a Potato 2.12 run directory
    theirs.mkdir()

    assert prune_run_dirs(config, store) == [1, 2]
    left = sorted(p.name for p in (config.training_dir / "runs").iterdir())
    assert left == ["20261130T184053-ce61b8", "3", "4", "5", "6"]  # 3 running, 6 queued, 4 and 5 newest finished
    assert store.count_runs() == 6 and store.get_run(1).state == "succeeded"
    assert prune_run_dirs(replace(config, model_training=replace(config.model_training, retain_runs=None)),
                          store) == []
