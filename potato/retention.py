"""``model_training.retain_runs``: delete the directories of older finished runs.

A run directory holds the model (a full fine-tune of MiniLM is 91 MB), its
predictions and logs; a project that retrains on every 25 annotations fills a
disk. With ``retain_runs: N`` the newest N finished runs keep their
directories and older finished runs lose theirs; their records stay in the run
store, so history, scores and triggers remain listed. Only directories of runs
the store knows are touched (Potato 2.12 keeps its own runs beside ours under
``training/runs/`` with timestamp names), and never a queued or running run's.
Unset, nothing is deleted.
"""

from __future__ import annotations

import shutil

from potato.config import ProjectConfig
from potato.runs.paths import run_paths
from potato.store import END_STATES, Store


def prune_run_dirs(config: ProjectConfig, store: Store) -> list[int]:
    """Delete the directories of finished runs older than the newest ``retain_runs``; return their ids."""
    keep = config.model_training.retain_runs
    if not keep:
        return []
    finished = [run for run in store.list_runs() if run.state in END_STATES]  # newest first
    removed = []
    for run in finished[keep:]:
        directory = run_paths(config, run.id).dir
        if directory.is_dir():
            shutil.rmtree(directory)
            removed.append(run.id)
    return sorted(removed)
