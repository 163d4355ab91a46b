"""The run queue: create runs, dispatch them FIFO one at a time, cancel, reconcile.

The store is the truth about runs. A run is created ``queued``; the dispatcher
starts the oldest queued run when no run is active, by starting the flow in a
child process (the embedded default) or through ``run_deployment`` when
``model_training.prefect_deployment`` names a deployment. Whatever the backend,
one run executes at a time (SPEC §3): the store's atomic claim decides which
run starts, and the flow also holds the project's Prefect concurrency limit
``potato-training-<project>`` (``potato.prefect_runs``), so runs started from
Prefect directly wait their turn too, and other projects on the same Prefect
never wait for this one.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from potato import prefect_runs
from potato.config import ProjectConfig
from potato.errors import DiskFull, HeartbeatTimeout, PotatoError, WallTimeExceeded
from potato.runlog import RunLog
from potato.store import END_STATES, Run, Store
from potato.tasks import leftovers
from potato.training.client import UNREACHABLE_LIMIT_S

log = logging.getLogger(__name__)

DEFAULT_TRAINER = "hf-text-classification"
# Added to max_wall_seconds for Prefect's own flow timeout: the relay step's
# one-second check stops the run first; Prefect's timeout is the backstop.
FLOW_TIMEOUT_MARGIN_S = 60
# The dispatcher's child runs flows.training_run; a Prefect process worker's runs prefect.engine.
FLOW_MARKERS = ("flows.training_run", "prefect.engine")
# A run claimed this recently may not have recorded its flow's pid yet.
CLAIM_GRACE_S = 30
# Beyond heartbeat_timeout_s + grace_seconds: the time a live flow gets to act on a silent worker
# itself (stop it, clean up on the host) before reconciliation takes the flow for wedged.
HEARTBEAT_MARGIN_S = 15
# A disk with less room than this left is full, for a run that failed writing to it (a model is larger).
DISK_FULL_BYTES = 1024 * 1024
# How often reconciliation tries again to stop what a run left on a host it could not reach.
RETRY_STOP_S = 15
# Beyond UNREACHABLE_LIMIT_S and grace_seconds: when an unreachable agent has surely stopped its worker.
SELF_STOP_MARGIN_S = 30


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


class LocalOnlyTrainerError(RunRequestError):
    """Raised when a trainer that runs only locally is asked for on another backend (HTTP 409)."""

    def __init__(self, trainer: str, backend: str, backend_type: str):
        self.trainer, self.backend = trainer, backend
        kind = {"ssh": "an ssh", "agent": "an agent"}.get(backend_type, f"a {backend_type}")
        super().__init__(
            f"Trainer {trainer!r} runs only on the local backend, and {backend!r} is {kind} "
            f"backend: it rewrites an earlier run's predictions, which are kept on this server. Start it on "
            f"'local' (it needs no GPU and takes seconds)"
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
    trigger: str = "manual",
    annotation_count: int | None = None,
    only_when_idle: bool = False,
) -> Run | None:
    """Queue a run after checking trainer, schemas and backend against the config.

    *trigger*, *annotation_count* and *only_when_idle* go to ``Store.create_run``
    (None when *only_when_idle* and a run is queued or running).
    """
    from potato.trainers import LOCAL_ONLY, TRAINERS

    trainer = trainer or DEFAULT_TRAINER
    if trainer not in TRAINERS:
        raise RunRequestError(f"Unknown trainer {trainer!r}; known trainers: {', '.join(sorted(TRAINERS))}")
    backend = backend or config.model_training.backend or "local"
    if backend not in config.model_training.backends:
        raise UnknownBackendError(backend, config.model_training.backends)
    backend_type = config.model_training.backends[backend].type
    if trainer in LOCAL_ONLY and backend_type != "local":
        raise LocalOnlyTrainerError(trainer, backend, backend_type)
    known = [s.name for s in config.schemes]
    if not schemas:
        schemas = list(config.model_training.writeback.schemas) or known
    for schema in schemas:
        if schema not in known:
            raise RunRequestError(f"Unknown schema {schema!r}; the config's annotation_schemes are: {', '.join(known)}")
    if options is not None and not isinstance(options, dict):
        raise RunRequestError("options must be a JSON object of trainer options")
    run = store.create_run(trainer, list(schemas), backend, options or {}, trigger=trigger,
                           annotation_count=annotation_count, only_when_idle=only_when_idle)
    if run is not None:
        private_dir(run_dir(config, run.id))
    return run


def cancel_run(config: ProjectConfig, store: Store, run_id: int) -> Run:
    """Cancel *run_id*: a queued run ends at once; an active one is stopped by its flow.

    A run handed to a Prefect work pool that no worker has started yet has no
    flow to stop it: its flow run is cancelled in Prefect and the run ends now.
    """
    run = store.get_run(run_id)
    if run.state in END_STATES:
        return run
    if store.transition(run_id, "cancelled", from_states=("queued",), error="Cancelled before it started"):
        return store.get_run(run_id)
    # Requested first: should a worker start the flow this instant, the flow sees it before spawning.
    run = store.request_cancel(run_id)
    if prefect_runs.waits_for_a_worker(run):
        return prefect_runs.cancel_before_a_worker(config, store, run)
    return run


def end_run(config: ProjectConfig, store: Store, run_id: int, state: str, error: str | None, *,
            log: RunLog | None = None) -> Run:
    """End run *run_id* as *state*, once nothing it started can still run: the one way a run ends.

    What the run left running is stopped and checked first (``leftovers.stop``).
    When that cannot be verified (its host is unreachable) the run stays
    ``running``, its step row says why and ``ending`` keeps the end it will get,
    so the dispatcher starts no run beside a worker that may still train;
    ``reconcile`` tries again every ``RETRY_STOP_S``. An agent that has not heard
    from the server for ``UNREACHABLE_LIMIT_S`` stops its worker by itself
    (SPEC §7), so once that long has passed since the agent was last heard
    from, the run ends anyway, its error saying that stopping was not verified.
    A local worker is always visible to this machine: there is no such limit.
    """
    run = store.get_run(run_id)
    if run.state in END_STATES:
        return run
    log = log or RunLog(store, run_id, run_dir(config, run_id) / "run.log")
    stopped = leftovers.stop(config, store, run)
    if not stopped.verified:
        now = time.time()
        deadline = _self_stop_deadline(config, run)
        if deadline is None or now < deadline:
            if not run.ending:
                log.warning(f"The run ends {state}, but Potato could not verify that its worker stopped: "
                            f"{stopped.said}. It stays active (no other run starts) until that is verified"
                            + (f", or until {time.strftime('%H:%M:%S', time.localtime(deadline))}, when its agent "
                               f"will have stopped the worker by itself" if deadline else ""))
            # The cancel mark makes the server answer the agent's next post with "stop".
            store.update_run(run_id, ending={"state": state, "error": error, "since": run.ending.get("since", now),
                                             "last_try": now, "why": stopped.said},
                             cancel_requested_at=run.cancel_requested_at or now,
                             step=f"stopping what the run left running: {stopped.said}; trying again")
            return store.get_run(run_id)
        error = (f"{error + '. ' if error else ''}Potato could not verify that the run's agent and worker on its host "
                 f"stopped ({stopped.said}); an agent stops its worker by itself after {UNREACHABLE_LIMIT_S} s "
                 f"without the server, and that time has passed")
        log.error(error)
    elif stopped.said:
        log.info(f"Stopped what the run left running: {stopped.said}")
    _remove_partial_uploads(run_dir(config, run_id))
    store.transition(
        run_id, state, from_states=("queued", "running"), error=error, ending=None,
        step={"succeeded": "finished", "cancelled": "cancelled"}.get(state, "failed"),
    )
    return store.get_run(run_id)


def partial_upload_prefix(target: Path) -> str:
    """The name an upload into *target* is written under until complete (``potato.protocol.predictions``)."""
    return f".{target.name}.upload-"


def _remove_partial_uploads(directory: Path) -> None:
    """An upload cut short by a killed flow (its own protocol server) leaves its temporary file: it goes."""
    for path in directory.glob(partial_upload_prefix(directory / "predictions.jsonl") + "*"):
        path.unlink(missing_ok=True)


def _self_stop_deadline(config: ProjectConfig, run: Run) -> float | None:
    """When a remote run's agent will have stopped its worker by itself; None for a local run."""
    backend = config.model_training.backends.get(run.backend)
    if not run.remote_job_dir and not run.slurm_job_id and (backend is None or backend.type == "local"):
        return None
    last_word = run.heartbeat_at or run.started_at or time.time()
    return last_word + UNREACHABLE_LIMIT_S + config.model_training.grace_seconds + SELF_STOP_MARGIN_S


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
    # A local worker's job directory is the run directory: its disk filling up is the server's, and then
    # the worker may not even have had room to say why it failed.
    if ctx.backend.type == "local" and (f"[Errno {errno.ENOSPC}]" in str(done.get("error")) or
                                        shutil.disk_usage(ctx.run_dir).free < DISK_FULL_BYTES):
        return str(DiskFull(ctx.run_dir))
    if done.get("error"):
        return str(done["error"])
    if code < 0:
        return f"The worker was killed by signal {-code}"
    tail = _last_line(ctx.run_dir / "worker.log")
    return f"The worker exited with code {code}" + (f": {tail}" if tail else "")


def describe_interruption(config: ProjectConfig, exc: BaseException) -> str:
    """Why the flow stopped when Prefect or a signal interrupted it."""
    from prefect.exceptions import TerminationSignal  # only a flow calls this: prefect is loaded

    # Inside a flow Prefect's own handler turns SIGTERM into TerminationSignal.
    if isinstance(exc, (SystemExit, TerminationSignal)):
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
    if run.state in END_STATES or run.ending:  # ended, or its end waits for a verified stop (reconcile)
        return
    message = getattr(state, "message", None) or "the flow ended before the run finished"
    end_run(config, store, run_id, "failed", f"The run's flow ended early: {message}")


def heartbeat_timeout(config: ProjectConfig, backend_name: str) -> float:
    """How long the worker or agent of a run on *backend_name* may say nothing (SPEC §1, default 120)."""
    backend = config.model_training.backends.get(backend_name)
    value = backend.get("heartbeat_timeout_s") if backend is not None else None
    return float(value or config.model_training.heartbeat_timeout_s)


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


def orphan_reason(config: ProjectConfig, run: Run, *, now: float, flow_alive: bool) -> str | None:
    """Why nobody drives running *run* any more, or None while its flow does.

    Its flow process is gone; or it lives but the worker's heartbeat is older
    than the run's timeout plus the time the flow needs to act on that itself
    (then the flow is wedged). A run claimed moments ago, or handed to a
    Prefect work pool that has not started its flow yet, has no flow to check.
    """
    if run.state != "running":
        return None
    if flow_alive:
        timeout = heartbeat_timeout(config, run.backend)
        limit = timeout + config.model_training.grace_seconds + HEARTBEAT_MARGIN_S
        if run.heartbeat_at and now - run.heartbeat_at > limit:
            backend = config.model_training.backends.get(run.backend)
            silence = HeartbeatTimeout(run.backend, timeout, agent=backend is not None and backend.type != "local")
            return (f"{silence}, and the run's flow (pid {run.flow_pid}) did not end the run within "
                    f"{limit - timeout:g} s more; Potato stopped the flow")
        return None
    if run.flow_pid is None:
        if run.prefect_flow_run_id or now - (run.started_at or 0) < CLAIM_GRACE_S:
            return None
        return "The run's flow process is gone (it never started); Potato marked the run failed"
    return (f"The run's flow process is gone (pid {run.flow_pid} ended without recording the run's end); "
            f"Potato stopped what the run left running and marked it failed")


def gone_before_its_turn(run: Run) -> str:
    return (f"The run's flow process is gone (pid {run.flow_pid} ended while the run waited for its turn); "
            "Potato marked the run failed")


def reconcile(config: ProjectConfig, store: Store, *, release_slot: bool = True,
              own_flows: Iterable[int] = ()) -> list[Run]:
    """End the runs nobody drives any more, after stopping what they left running.

    Called on every pass of the dispatcher (the server's, and ``potato
    training run``'s), so an orphaned run never holds the queue until a
    restart: a run whose flow process is gone, or whose flow is wedged with a
    stale heartbeat (it is killed), fails with a reason that says which; a run
    whose end waits for a verified stop (``ending``) is tried again every
    ``RETRY_STOP_S``. A run whose flow lives and acts is left alone, and so is
    one whose dead flow is a child of the caller (*own_flows*): the caller
    reaps it and knows how it exited. A queued run that its own flow (a
    Prefect deployment's) was to start fails once that flow process is gone.
    """
    ended = []
    now = time.time()
    own_flows = set(own_flows)
    for run in store.waiting_flow_runs():  # a flow that created its run died before the run's turn came
        if not _pid_runs(run.flow_pid, *FLOW_MARKERS) and store.transition(
                run.id, "failed", from_states=("queued",), error=gone_before_its_turn(run), step="failed"):
            ended.append(store.get_run(run.id))
    for run in store.active_runs():
        flow_alive = _pid_runs(run.flow_pid, *FLOW_MARKERS)
        if not flow_alive and run.flow_pid in own_flows:
            continue
        if run.ending:
            if flow_alive or now - float(run.ending.get("last_try") or 0) < RETRY_STOP_S:
                continue
            state, error = run.ending.get("state", "failed"), run.ending.get("error")
        else:
            error = orphan_reason(config, run, now=now, flow_alive=flow_alive)
            if error is None:
                continue
            state = "failed"
            if flow_alive:
                _kill_flow(run.flow_pid)
        run = end_run(config, store, run.id, state, error)
        if run.state in END_STATES:
            ended.append(run)
    if release_slot and ended:
        release_slot_if_idle(config, store)
    return ended


def release_slot_if_idle(config: ProjectConfig, store: Store) -> None:
    """Free the Prefect slot a dead flow held (its lease would expire only after LEASE_SECONDS), if no run is active.

    Checking Prefect on every start would cost each CLI command the import of
    prefect (~1 s); a slot leaks only when its holder died, i.e. when a run was
    just ended here.
    """
    if any(r.state == "running" for r in store.active_runs()):
        return
    try:
        from potato.prefect_api import release_leaked_slots

        release_leaked_slots(prefect_runs.limit_name(config))
    except Exception as exc:  # Prefect down: the flow's own lease expiry frees it later
        log.warning("Could not release the Prefect concurrency slot: %s", exc)


def _kill_flow(pid: int) -> None:
    """SIGKILL a wedged flow (with the ssh client it started, when it leads its own process group)."""
    try:
        os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
    except OSError:
        return
    deadline = time.monotonic() + 5
    while _pid_runs(pid, *FLOW_MARKERS) and time.monotonic() < deadline:
        time.sleep(0.05)


def describe_flow_exit(config: ProjectConfig, run_id: int, returncode: int) -> str:
    how = (f"was killed by {signal.Signals(-returncode).name}" if returncode < 0 and -returncode in
           signal.valid_signals() else f"exited with code {returncode}")
    return (f"The run's flow process {how} before the run finished; Potato stopped what the run left running "
            f"(see {run_dir(config, run_id) / 'flow.log'})")


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
        """Reap finished flows, reconcile orphaned runs; start the oldest queued run if none is active."""
        ended = False
        for run_id, process in list(self.processes.items()):
            if process.poll() is not None:
                del self.processes[run_id]
                run = self.store.get_run(run_id)
                if run.state not in END_STATES and not run.ending:
                    error = describe_flow_exit(self.config, run_id, process.returncode)
                    ended = end_run(self.config, self.store, run_id, "failed", error).state in END_STATES or ended
        if ended:
            release_slot_if_idle(self.config, self.store)
        reconcile(self.config, self.store, own_flows=[p.pid for p in self.processes.values()])
        if self.config.model_training.prefect_deployment:
            prefect_runs.fail_runs_no_worker_started(self.config, self.store)
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
            tags=prefect_runs.flow_run_tags(self.config, run),
        )
        step = f"waiting for a Prefect worker on pool {flow_run.work_pool_name}"
        self.store.update_run(run.id, prefect_flow_run_id=str(flow_run.id), step=step)
        self.store.add_event(run.id, "step", {"text": step})  # as RunContext.set_step keeps step rows

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
