"""The run queue: create runs, dispatch them FIFO one at a time, cancel, reconcile.

The store is the truth about runs. A run is created ``queued``; the dispatcher
starts the oldest queued run when no run is active, by starting the flow in a
child process (the embedded default) or through ``run_deployment`` when
``model_training.prefect_deployment`` names a deployment. Whatever the backend,
one run executes at a time (SPEC §3): the store's atomic claim decides which
run starts, and the flow also holds the Prefect concurrency limit
``potato-training``, so runs started from Prefect directly wait their turn too.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from potato.config import ProjectConfig
from potato.errors import PotatoError, WallTimeExceeded
from potato.prefect_api import LIMIT_NAME
from potato.store import END_STATES, Run, Store

log = logging.getLogger(__name__)

DEFAULT_TRAINER = "hf-text-classification"
CONCURRENCY_LIMIT = LIMIT_NAME  # "potato-training": held by every training flow
# Added to max_wall_seconds for Prefect's own flow timeout: the relay step's
# one-second check stops the run first; Prefect's timeout is the backstop.
FLOW_TIMEOUT_MARGIN_S = 60


class RunRequestError(PotatoError):
    """Raised when a run request names an unknown trainer or schema (HTTP 400)."""


class UnknownBackendError(RunRequestError):
    """Raised when a run request names a backend not in the config (HTTP 409)."""

    def __init__(self, name: str, known: Iterable[str]):
        self.name = name
        self.known = sorted(known)
        super().__init__(
            f"No backend named {name!r} in model_training.backends; known backends: {', '.join(self.known)}"
        )


def open_store(config: ProjectConfig) -> Store:
    private_dir(config.training_dir)
    return Store(config.training_dir / "runs.db")


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


def run_dir(config: ProjectConfig, run_id: int) -> Path:
    return config.training_dir / "runs" / str(run_id)


def create_run(
    config: ProjectConfig,
    store: Store,
    *,
    trainer: str | None = None,
    schemas: list[str] | None = None,
    backend: str | None = None,
    options: dict | None = None,
) -> Run:
    """Queue a run after checking trainer, schemas and backend against the config."""
    from potato.trainers import TRAINERS

    trainer = trainer or DEFAULT_TRAINER
    if trainer not in TRAINERS:
        raise RunRequestError(f"Unknown trainer {trainer!r}; known trainers: {', '.join(sorted(TRAINERS))}")
    backend = backend or config.model_training.backend or "local"
    if backend not in config.model_training.backends:
        raise UnknownBackendError(backend, config.model_training.backends)
    known = [s.name for s in config.schemes]
    if not schemas:
        schemas = list(config.model_training.writeback.schemas) or known
    for schema in schemas:
        if schema not in known:
            raise RunRequestError(f"Unknown schema {schema!r}; the config's annotation_schemes are: {', '.join(known)}")
    if options is not None and not isinstance(options, dict):
        raise RunRequestError("options must be a JSON object of trainer options")
    run = store.create_run(trainer, list(schemas), backend, options or {})
    private_dir(run_dir(config, run.id))
    return run


def cancel_run(config: ProjectConfig, store: Store, run_id: int) -> Run:
    """Cancel *run_id*: a queued run ends at once; an active one is stopped by its flow."""
    run = store.get_run(run_id)
    if run.state in END_STATES:
        return run
    if store.transition(run_id, "cancelled", from_states=("queued",), error="Cancelled before it started"):
        return store.get_run(run_id)
    return store.request_cancel(run_id)


def finish_run(store: Store, run_id: int, state: str, error: str | None) -> Run:
    store.transition(
        run_id, state, from_states=("queued", "running"), error=error,
        step={"succeeded": "finished", "cancelled": "cancelled"}.get(state, "failed"),
    )
    return store.get_run(run_id)


def read_scores(directory: Path) -> dict[str, Any]:
    try:
        return json.loads((directory / "scores.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def describe_worker_failure(ctx, code: int) -> str:
    # A remote worker's events reach the store through the agent protocol, not this process.
    events = ctx.store.events(ctx.run_id)
    # An agent's result says why a job ended when the worker could not (e.g. SLURM ended it): first.
    result = next((e.data for e in reversed(events) if e.kind == "result"), {})
    if result.get("error"):
        return str(result["error"])
    done = ctx.extra.get("done") or next((e.data for e in reversed(events) if e.kind == "done"), {})
    if done.get("error"):
        return str(done["error"])
    if code < 0:
        return f"The worker was killed by signal {-code}"
    tail = _last_line(ctx.run_dir / "worker.log")
    return f"The worker exited with code {code}" + (f": {tail}" if tail else "")


def describe_interruption(config: ProjectConfig, exc: BaseException) -> str:
    """Why the flow stopped when Prefect or a signal interrupted it."""
    if isinstance(exc, SystemExit):
        return "The flow process was stopped (SIGTERM) while the run was active"
    if isinstance(exc, KeyboardInterrupt):
        return "The flow process was interrupted while the run was active"
    limit = config.model_training.max_wall_seconds
    if limit:
        return str(WallTimeExceeded(limit))
    return f"The flow was interrupted: {type(exc).__name__}: {exc}"


def flow_timeout_seconds(config: ProjectConfig) -> float | None:
    mt = config.model_training
    if not mt.max_wall_seconds:
        return None
    return mt.max_wall_seconds + mt.grace_seconds + FLOW_TIMEOUT_MARGIN_S


def after_flow(config: ProjectConfig, run_id: int, state) -> None:
    """Make sure a run whose flow ended is not left active (the flow may have died early)."""
    store = open_store(config)
    run = store.get_run(run_id)
    if run.state in END_STATES:
        return
    message = getattr(state, "message", None) or "the flow ended before the run finished"
    finish_run(store, run_id, "failed", f"The run's flow ended early: {message}")


def ensure_prefect_limit() -> None:
    from potato.prefect_api import ensure_concurrency_limit

    ensure_concurrency_limit(CONCURRENCY_LIMIT, 1)


# ---------------------------------------------------------------- dispatching


def _pid_runs(pid: int | None, *markers: str) -> bool:
    """True when process *pid* is alive and its command line contains one of *markers* (pids get reused)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return False
    except (OSError, IndexError):
        pass
    return any(marker in cmdline for marker in markers)


def reconcile(config: ProjectConfig, store: Store, *, release_slot: bool = True) -> list[Run]:
    """Fail runs left active by a process that is gone; free what they held.

    A run whose flow process still lives is left alone (it finishes and
    records its own end). Otherwise its worker's process group is killed and
    the run is failed with a reason that says what happened.
    """
    failed = []
    for run in store.active_runs():
        if run.state != "running":
            continue
        # The dispatcher's child runs flows.training_run; a Prefect process worker's runs prefect.engine.
        if _pid_runs(run.flow_pid, "flows.training_run", "prefect.engine"):
            continue
        if run.flow_pid is None and (run.prefect_flow_run_id or time.time() - (run.started_at or 0) < 30):
            continue  # handed to a Prefect work pool and not started yet, or just claimed: its flow is coming
        if _pid_runs(run.worker_pid, "potato.training.worker"):
            try:
                os.killpg(run.worker_pid, 9)
            except OSError:
                pass
        store.transition(
            run.id, "failed", from_states=("running",), step="failed",
            error="The run's flow process is gone (the annotation server or machine stopped during the run); "
            "the run was marked failed when Potato restarted",
        )
        failed.append(store.get_run(run.id))
    # A slot leaks only when its holder died, i.e. when a run was just failed here; checking
    # Prefect on every start would cost each CLI command the import of prefect (~1 s).
    if release_slot and failed and not any(r.state == "running" for r in store.active_runs()):
        try:
            from potato.prefect_api import release_leaked_slots

            release_leaked_slots(CONCURRENCY_LIMIT)
        except Exception as exc:  # Prefect down: the flow's own lease expiry frees it later
            log.warning("Could not release the Prefect concurrency slot: %s", exc)
    return failed


class Dispatcher:
    """Starts queued runs FIFO, one at a time, each as a flow in a child process."""

    def __init__(self, config: ProjectConfig, store: Store, *, python: str | None = None, poll_seconds: float = 0.25):
        self.config = config
        self.store = store
        self.python = python or sys.executable
        self.poll_seconds = poll_seconds
        self.processes: dict[int, subprocess.Popen] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def dispatch_once(self) -> Run | None:
        """Reap finished flows; start the oldest queued run if none is active."""
        for run_id, process in list(self.processes.items()):
            if process.poll() is not None:
                del self.processes[run_id]
                run = self.store.get_run(run_id)
                if run.state not in END_STATES:
                    finish_run(self.store, run_id, "failed",
                               f"The run's flow process exited with code {process.returncode} before the run finished; "
                               f"see {run_dir(self.config, run_id) / 'flow.log'}")
        run = self.store.claim_next_queued(only_when_idle=True, step="starting the run's flow")
        if run is not None:
            self.launch(run)
        return run

    def launch(self, run: Run) -> None:
        deployment = getattr(self.config.model_training, "prefect_deployment", None)
        if deployment:
            self._launch_deployment(run, deployment)
            return
        directory = private_dir(run_dir(self.config, run.id))
        argv = [self.python, "-m", "flows.training_run", "--config", str(self.config.path), "--run-id", str(run.id)]
        with open(directory / "flow.log", "ab") as out:
            # Its own session: a Ctrl-C in the terminal reaches the CLI, not the flow,
            # and the flow outlives a crashed server (reconcile() re-attaches to it).
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, env=_flow_env(),
            )
        self.store.update_run(run.id, flow_pid=process.pid, step="starting the run's flow")
        self.processes[run.id] = process

    def _launch_deployment(self, run: Run, deployment: str) -> None:
        from prefect.deployments import run_deployment

        flow_run = run_deployment(
            deployment,
            parameters={"config": str(self.config.path), "run_id": run.id},
            timeout=0,
            flow_run_name=f"run-{run.id}",
        )
        self.store.update_run(run.id, prefect_flow_run_id=str(flow_run.id),
                              step=f"waiting for a Prefect worker (deployment {deployment})")

    def wait_for_flows(self, timeout: float = 15) -> None:
        """Give flows that recorded their run's end time to exit (Prefect's last API calls)."""
        deadline = time.monotonic() + timeout
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("The flow process %s is still finishing", process.pid)

    # The annotation server runs the dispatcher in a thread.
    def start(self) -> None:
        reconcile(self.config, self.store)
        self._thread = threading.Thread(target=self._loop, name="potato-dispatcher", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.dispatch_once()
            except Exception:
                log.exception("dispatcher")

    def stop(self, *, stop_flows: bool = True, timeout: float = 30) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if stop_flows:
            for process in self.processes.values():
                if process.poll() is None:
                    process.terminate()
            deadline = time.monotonic() + timeout
            for process in self.processes.values():
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()


def _flow_env() -> dict:
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def _last_line(path: Path) -> str:
    try:
        lines = [l for l in path.read_text(encoding="utf-8", errors="replace").splitlines() if l.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""
