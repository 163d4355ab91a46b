"""The job a worker runs: job.json, built the same way for every backend.

Below both the flow's steps (potato/backends) and the agent protocol
(potato/protocol), which hands it to remote agents in a claim's answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from potato.config import ProjectConfig
from potato.prefill.review_order import order_spec
from potato.runs.store import Run
from potato.training import atomic_files
from potato.training.job_paths import JobPaths


def make_job(config: ProjectConfig, run: Run, *, bundle: str) -> dict[str, Any]:
    """Return job.json's content for *run* (docs/architecture.md, "The job directory")."""
    mt = config.model_training

    def options_of(trainer: str) -> dict[str, Any]:
        return trainer_options(config, run, trainer)

    plan = run.trainers
    backend = mt.backends.get(run.backend)
    # device, num_threads and max_ram_mb are settings of this machine; a remote worker
    # takes the GPUs the backend chose (CUDA_VISIBLE_DEVICES) and its threads from the env.
    local = backend is None or backend.type_info.on_this_machine
    job = {
        "run_id": run.id,
        "trainer": run.trainer,
        "schemas": list(run.schemas),
        "bundle": bundle,
        "options": options_of(run.trainer) if len(plan) == 1 else {},
        "device": mt.device if local else "auto",
        "num_threads": mt.num_threads if local else None,
        "max_ram_mb": mt.max_ram_mb if local else None,
        "include_unlabeled": mt.writeback.include_unlabeled,
        "grace_seconds": mt.grace_seconds,
        "processes": processes_for(backend),
    }
    order = order_spec(config)
    if order is not None:  # what a trainer that orders where its model is needs (potato.training.trainers.diverse_order)
        job["order"] = order
    if len(plan) > 1:  # several trainers, one after the other (potato/training/parts.py)
        job["parts"] = [{"trainer": trainer, "schemas": list(schemas), "options": options_of(trainer)}
                        for trainer, schemas in plan.items()]
    return job


def trainer_options(config: ProjectConfig, run: Run | None, trainer: str) -> dict[str, Any]:
    """The options *trainer* gets in *run*: the config's for it, then the run's own (*run* None: the config's
    alone, what ``potato training check`` assumes a run has)."""
    return options_with(config, trainer, (run.options or {}) if run is not None else {})


def options_with(config: ProjectConfig, trainer: str, own: dict[str, Any] | None) -> dict[str, Any]:
    """The config's options for *trainer*, then a run's *own* over them."""
    return {**config.model_training.trainers.get(trainer, {}), **(own or {})}


def processes_for(backend: Any) -> int | str | None:
    """job.json's ``processes``: the backend's setting, else one per GPU where the backend chose
    the GPUs (ssh: ``gpus``/``max_gpus``; slurm: ``gres``), else one process (local, agent)."""
    configured = backend.get("processes") if backend is not None else None
    if configured:
        return configured
    if backend is not None and (backend.type_info.picks_gpus or backend.type_info.has_scheduler):
        return "per_gpu"
    return None


def write_job(job_dir: Path, job: dict[str, Any]) -> Path:
    job_dir.mkdir(parents=True, exist_ok=True)
    path = Path(JobPaths(job_dir).job)
    atomic_files.write_text(path, json.dumps(job, indent=2))
    return path
