"""Every file of a job directory, named in one place, and the one reader of ``exit_code``.

A job directory is where a worker reads its job and writes what it made
(docs/architecture.md, "The job directory"): a local run's is its run
directory on the server, an ssh or slurm run's is ``remote_dir/jobs/<run>-<hex>``
on the host, an agent's is under its ``--workdir``. The worker, the agent,
the SLURM submitter and the server all find these files through
``JobPaths``, so a name is spelled once; the server's run directory
(``potato.runs.paths.RunPaths``) builds on the same names.

Part of the remote half: Python 3.8, standard library only.
"""

import os
from typing import Any, Optional

JOB = "job.json"
EVENTS = "events.jsonl"
PREDICTIONS = "predictions.jsonl"
SCORES = "scores.json"
EXIT_CODE = "exit_code"          # written last, atomically: the job is over once it exists
ARTIFACTS = "artifacts"
BUNDLE = "bundle"
BUNDLE_ARCHIVE = "bundle.tar.gz"
LABELS = "labels.jsonl"           # a run's holdout evaluation; decision-calibrate's bundle carries one
WORKER_LOG = "worker.log"        # the worker's stdout and stderr, where its supervisor keeps them
# What stop_job.py (sent alone to a host, so it spells them itself) reads to find what to stop.
AGENT_PID = "agent.pid"
WORKER_PID = "worker.pid"
SLURM_JOB_ID = "slurm_job_id"
RANKS = "ranks"                  # ranks/<rank>/: one data-parallel process's own files
SLURM_CONFIG = "slurm.json"      # the backend's SLURM keys, for an agent that submits
JOB_SCRIPT = "job.sh"
SLURM_OUT = "slurm.out"          # SLURM's own output of the job
STDERR = "stderr.log"            # a SLURM job's worker's stderr


class _File(object):
    """A file of the job directory, by name: ``paths.events`` is ``<dir>/events.jsonl``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, paths: Optional["JobPaths"], owner: type) -> Any:
        return self if paths is None else os.path.join(paths.dir, self.name)


class JobPaths(object):
    """The files of the job directory ``directory`` (a path on the machine that reads them)."""

    def __init__(self, directory: str) -> None:
        self.dir = str(directory)

    job = _File(JOB)
    events = _File(EVENTS)
    predictions = _File(PREDICTIONS)
    scores = _File(SCORES)
    exit_code = _File(EXIT_CODE)
    artifacts = _File(ARTIFACTS)
    bundle = _File(BUNDLE)
    bundle_archive = _File(BUNDLE_ARCHIVE)
    worker_log = _File(WORKER_LOG)
    agent_pid = _File(AGENT_PID)
    worker_pid = _File(WORKER_PID)
    slurm_job_id = _File(SLURM_JOB_ID)
    slurm_config = _File(SLURM_CONFIG)
    job_script = _File(JOB_SCRIPT)
    slurm_out = _File(SLURM_OUT)
    stderr = _File(STDERR)

    def rank(self, rank: int) -> "JobPaths":
        """The files of process ``rank`` of a data-parallel run: ``ranks/<rank>/``."""
        return JobPaths(os.path.join(self.dir, RANKS, str(rank)))


def read_exit_code(directory: str) -> Optional[int]:
    """The code in ``directory``'s ``exit_code``; None while there is none (or it is not a number).

    The one reader, whoever wrote the file: the worker as its very last act,
    a data-parallel process, or the server on an agent's reported result.
    """
    try:
        with open(os.path.join(str(directory), EXIT_CODE), encoding="utf-8") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None
