"""``model_training.retain_runs``: delete the directories of older finished runs.

A run directory holds the model (a full fine-tune of MiniLM is 91 MB), its
predictions and logs; a project that retrains on every 25 annotations fills a
disk. With ``retain_runs: N`` the newest N *succeeded training runs* keep
their directories, and so does every run finished after the oldest of them
(a failed run's log is how its failure is read); older finished runs lose
theirs. Failed, cancelled and decision-calibrate runs do not count towards N:
two failures in a row must not cost the last good model.

Never deleted, however old:

- a run whose predictions the writeback file holds for any schema: its
  ``labels.jsonl`` says what it trained on and its model made what annotators
  see pre-filled;
- the run a kept decision-calibrate run calibrated (its predictions and
  holdout evaluation are what the calibration rewrote);
- a queued or running run, and any directory the store does not know (Potato
  2.12 keeps its own runs beside ours under ``training/runs/``, with
  timestamp names).

Records stay in the run store, so history, scores and triggers remain listed.
Unset, nothing is deleted.
"""

from __future__ import annotations

import shutil

from potato.config import ProjectConfig
from potato.results.evaluation import read_evaluation
from potato.results.writeback import live_run_ids
from potato.runs.paths import run_paths
from potato.runs.store import END_STATES, SUCCEEDED, Run, Store
from potato.training.trainers.decision_calibrate import NAME as CALIBRATE


def prune_run_dirs(config: ProjectConfig, store: Store) -> list[int]:
    """Delete the directories of finished runs the rules above do not keep; return their ids."""
    keep = config.model_training.retain_runs
    if not keep:
        return []
    every = store.list_runs()  # newest first
    trained = [run for run in every if run.state == SUCCEEDED and run.trainer != CALIBRATE]
    if len(trained) <= keep:
        return []
    oldest_kept = trained[keep - 1].id
    kept_calibrations = [run for run in every if run.trainer == CALIBRATE and run.id >= oldest_kept]
    protected = live_run_ids(config) | ({_calibrated_run(config, run) for run in kept_calibrations} - {None})
    removed = []
    for run in every:
        if run.state not in END_STATES or run.id >= oldest_kept or run.id in protected:
            continue
        directory = run_paths(config, run.id).dir
        if directory.is_dir():
            shutil.rmtree(directory)
            removed.append(run.id)
    return sorted(removed)


def _calibrated_run(config: ProjectConfig, run: Run) -> int | None:
    """The run decision-calibrate run *run* calibrated (its evaluation names it), or the one it was asked for."""
    evaluation = read_evaluation(run_paths(config, run.id).dir) or {}
    found = evaluation.get("run_id", (run.options or {}).get("run"))
    return found if isinstance(found, int) and found != run.id else None
