"""Every file of a run directory, named in one place (``RunPaths``), and the run store's (``open_store``).

A run keeps everything under ``<output_annotation_dir>/training/runs/<id>/``
(docs/architecture.md, "Files of a project"). A local run's worker uses that
directory as its job directory, and a remote run's results are copied into
it under the same names, so the names the two share come from the remote
half's ``potato.training.job_paths``; the ones only the server writes are
spelled here. Code asks ``run_paths(config, run_id)`` rather than joining
names itself.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import potato
from potato.config import ProjectConfig
from potato.runs.store import Store
from potato.training import atomic_files, job_paths

# Where this installation of potato is: the processes it starts (a flow, a local worker) import the same.
PACKAGE_ROOT = Path(potato.__file__).resolve().parents[1]


def importing_this_potato(env: dict[str, str]) -> dict[str, str]:
    """*env* with this installation first on ``PYTHONPATH``, for a child process that runs ``-m potato…``."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    return env


def private_dir(path: Path) -> Path:
    """Make *path* a directory only its owner can enter (0700), tightening one made wider before.

    Everything training keeps (the store, run logs, bundles of the annotators'
    labels, models, predictions) lives under such directories; the commands
    and the flow also run with umask 077, so what they create inside is 0600.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


class _File:
    """A file of the run directory, by name: ``paths.scores`` is ``paths.dir / "scores.json"``."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, paths: RunPaths | None, owner: type) -> Any:
        return self if paths is None else paths.dir / self.name


@dataclass(frozen=True)
class RunPaths:
    """The files of one run directory."""

    dir: Path

    # What the worker writes (a local run's job directory is its run directory), or what
    # reaches the server under the same names from a remote one.
    job = _File(job_paths.JOB)
    events = _File(job_paths.EVENTS)
    predictions = _File(job_paths.PREDICTIONS)
    scores = _File(job_paths.SCORES)
    exit_code = _File(job_paths.EXIT_CODE)
    artifacts = _File(job_paths.ARTIFACTS)
    bundle = _File(job_paths.BUNDLE)
    bundle_archive = _File(job_paths.BUNDLE_ARCHIVE)
    worker_log = _File(job_paths.WORKER_LOG)
    labels = _File(job_paths.LABELS)  # every labelled item of the run's schemas, with its holdout prediction
    # The server's own.
    run_log = _File("run.log")
    flow_log = _File("flow.log")  # the flow's output: the dispatcher's child's, a flow's under a Prefect worker
    agent_log = _File("agent.log")  # an ssh or slurm run's agent's stderr
    artifacts_partial = _File("artifacts.partial")  # a remote run's model files, until all have arrived
    evaluation = _File("evaluation.json")  # the holdout evaluation the run page draws (potato.results.evaluation)
    training_data = _File("training-data.json")  # the counts a model card states (potato.publish.facts)
    uncalibrated_predictions = _File("predictions.uncalibrated.jsonl")  # the worker's, once decision-calibrate rewrote them
    written_back = _File("written-back.jsonl")  # what the run wrote back, per item and schema (potato.results.writeback)
    writeback_report = _File("writeback.json")  # what the Training page shows of its writeback
    stability = _File("stability.json")  # predicted labels changed since the previous run (potato.results.stability)
    gate = _File("gate.json")  # the quality gate's verdict per schema, and who promoted the run (potato.results.quality_gate)

    def partial_upload_prefix(self) -> str:
        """The name an uploaded ``predictions.jsonl`` has until all of it has arrived (``potato.protocol``)."""
        return f".{job_paths.PREDICTIONS}.upload-"

    def read_exit_code(self) -> int | None:
        return job_paths.read_exit_code(str(self.dir))

    def read_scores(self) -> dict[str, Any]:
        try:
            return json.loads(self.scores.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}


def open_store(config: ProjectConfig) -> Store:
    """The project's run store, ``training/runs.db`` (its directory made private first)."""
    private_dir(config.training_dir)
    return Store(config.training_dir / "runs.db")


def run_paths(config: ProjectConfig, run_id: int) -> RunPaths:
    """The files of run *run_id* of the project *config* describes."""
    return RunPaths(config.training_dir / "runs" / str(run_id))


def training_page_file(config: ProjectConfig) -> Path:
    """Where ``potato start`` records its Training page's address, so that what a run leaves elsewhere (its
    Prefect artifacts) can link back to it."""
    return config.training_dir / "training-page"


def record_training_page(config: ProjectConfig, url: str) -> None:
    private_dir(config.training_dir)
    atomic_files.write_text(training_page_file(config), url)


def run_page(config: ProjectConfig, run_id: int) -> str | None:
    """Run *run_id*'s page on the Training page ``potato start`` last recorded, or None (never started)."""
    try:
        page = training_page_file(config).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return f"{page}/runs/{run_id}" if page.startswith(("http://", "https://")) else None
