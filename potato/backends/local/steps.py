"""The local backend's steps and stop: the worker runs as a child process of this machine.

The run directory is the worker's job directory, so predictions, scores and
artifacts land where the run keeps them and nothing has to be copied.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from potato.backend_types.contract import Stopped
from potato.backends.base import RunContext
from potato.backends.relay import EventTail, record_event
from potato.config import ProjectConfig
from potato.runs.jobs import make_job, write_job
from potato.runs.paths import importing_this_potato, run_paths
from potato.runs.stopping import LOCAL_WAIT_S, wait_gone
from potato.runs.store import Run, Store
from potato.training.device import THREAD_VARIABLES
from potato.training.stop_job import processes


@dataclass
class LocalSession:
    job_dir: Path


@dataclass
class LocalWorker:
    process: subprocess.Popen
    tail: EventTail
    log_file: object = None
    exit_code: int | None = None
    pgid: int | None = None


def make_worker_argv(job_dir: Path, python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", "potato.training.worker", str(job_dir)]


def make_worker_env(ctx: RunContext, base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    threads = ctx.config.model_training.num_threads
    if threads:
        for name in THREAD_VARIABLES:
            env[name] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    return importing_this_potato(env)  # the same potato as this process, wherever it was started


def connect(ctx: RunContext) -> LocalSession:
    ctx.log.info("Local backend: the worker runs on this machine; nothing to connect to")
    return LocalSession(job_dir=ctx.run_dir)


def pick_gpu(ctx: RunContext, session: LocalSession) -> str:
    # Importing torch here would cost the flow seconds; the worker picks the device
    # and reports it in its first event, which the relay step records.
    setting = ctx.config.model_training.device
    ctx.log.info(f"Device setting {setting!r}: the worker picks it and reports what it uses")
    return setting


def sync_code(ctx: RunContext, session: LocalSession) -> str:
    ctx.log.info("Local backend: the worker runs this installation's code; nothing to copy")
    return "nothing to copy"


def spawn(ctx: RunContext, session: LocalSession) -> LocalWorker:
    job = make_job(ctx.config, ctx.run, bundle=str(ctx.bundle_dir))
    write_job(session.job_dir, job)
    for stale in (ctx.paths.events, ctx.paths.exit_code):
        stale.unlink(missing_ok=True)
    log_file = open(ctx.paths.worker_log, "ab")
    argv = make_worker_argv(session.job_dir)
    ctx.log.debug("Starting the worker: " + " ".join(argv))
    # A new session makes the worker a process-group leader, so stop() can signal
    # every process it started, not just the worker itself.
    process = subprocess.Popen(
        argv,
        cwd=session.job_dir,
        env=make_worker_env(ctx),
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    ctx.store.update_run(ctx.run_id, worker_pid=process.pid)
    ctx.store.heartbeat(ctx.run_id)  # silence is counted from the worker's start, not the run's
    ctx.set_step("training on this machine")
    return LocalWorker(process=process, tail=EventTail(ctx.paths.events), log_file=log_file, pgid=process.pid)


def poll(ctx: RunContext, session: LocalSession, worker: LocalWorker) -> int | None:
    """Relay the worker's new events; return its exit code once it has exited or written it.

    The worker writes ``exit_code`` last; the interpreter's own exit (torch's
    teardown) takes most of a second more, which the run need not wait for.
    """
    code = worker.process.poll()
    if code is None:
        code = ctx.paths.read_exit_code()
    for event in worker.tail.read_new():
        record_event(ctx, event)
    if code is None:
        return None
    for event in worker.tail.read_new():  # lines written just before it exited
        record_event(ctx, event)
    worker.exit_code = code
    return code


def stop(ctx: RunContext, session: LocalSession, worker: LocalWorker, grace: float) -> None:
    """SIGTERM the worker's process group, SIGKILL it after *grace* seconds."""
    if worker is None or worker.process.poll() is not None:
        _reap_group(worker)
        return
    _signal_group(worker.pgid, signal.SIGTERM)
    _signal_group(worker.pgid, signal.SIGCONT)  # a stopped worker cannot act on TERM
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if poll(ctx, session, worker) is not None:
            break
        time.sleep(0.1)
    else:
        ctx.log.warning(f"The worker did not stop within {grace:g} s of SIGTERM; sending SIGKILL")
    _reap_group(worker)
    poll(ctx, session, worker)


def fetch_artifacts(ctx: RunContext, session: LocalSession, worker: LocalWorker) -> None:
    where = ctx.artifacts_dir
    if where.is_dir():
        ctx.store.update_run(ctx.run_id, artifact_uri=str(where))
        ctx.log.info(f"Artifacts are in {where}")
    else:
        ctx.log.info("The trainer saved no artifacts")


def clean_up(ctx: RunContext, session: LocalSession | None, worker: LocalWorker | None) -> None:
    if worker is not None:
        if worker.exit_code is not None:
            try:  # it reported its end and is only tearing down
                worker.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if worker.process.poll() is None:
            stop(ctx, session, worker, grace=min(5.0, ctx.config.model_training.grace_seconds))
        _reap_group(worker)
        if worker.log_file is not None:
            worker.log_file.close()
    if session is not None:
        shutil.rmtree(ctx.bundle_dir, ignore_errors=True)


def _signal_group(pgid: int | None, sig: int) -> None:
    if pgid is None:
        return
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _reap_group(worker: LocalWorker | None) -> None:
    """Kill whatever is left in the worker's process group and reap the worker."""
    if worker is None:
        return
    _signal_group(worker.pgid, signal.SIGKILL)
    try:
        worker.process.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
        pass


def stop_leftovers(config: ProjectConfig, store: Store, run: Run) -> Stopped:
    """SIGKILL the local worker's process group, if a process of it still runs this run's worker."""
    if not run.worker_pid:
        return Stopped(True)
    marker = str(run_paths(config, run.id).dir)  # the worker's argv names its job directory, the run directory
    group = [(pid, cmdline) for pid, pgid, cmdline in processes() if pgid == run.worker_pid]
    if not any("potato.training.worker" in cmdline and marker in cmdline for _, cmdline in group):
        return Stopped(True)  # gone, or the group id was reused by someone else
    try:
        os.killpg(run.worker_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    left = wait_gone([pid for pid, _ in group], LOCAL_WAIT_S)
    if left:
        return Stopped(False, f"the worker's process group {run.worker_pid} still runs (pids {left}) after SIGKILL")
    return Stopped(True, f"stopped the worker's process group {run.worker_pid} on this machine")
