"""Reconciliation: end the runs nobody drives any more, on every pass of the dispatcher.

A run's flow may die (kill -9, the OOM killer, a crashed server) or wedge;
then nothing would end its run, and the one-run-at-a-time queue would wait
for it forever. The dispatcher's every pass (``potato start``'s and
``potato training run``'s) checks the active runs: a run whose flow process
is gone, or whose flow lives beside a long-silent worker, is ended
(``potato.runs.ending``) with a reason that says which, and the Prefect slot
the dead flow held is freed. Flows are taken to run on the annotation
server's machine (the dispatcher's child, or a ``process`` work pool there):
their pid is checked here.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Iterable

from potato.config import ProjectConfig
from potato.errors import HeartbeatTimeout
from potato.runs import prefect_runs
from potato.runs.ending import RETRY_STOP_S, end_run
from potato.runs.store import END_STATES, Run, Store

log = logging.getLogger(__name__)

# The dispatcher's child runs flows.training_run; a Prefect process worker's runs prefect.engine.
FLOW_MARKERS = ("flows.training_run", "prefect.engine")
# A run claimed this recently may not have recorded its flow's pid yet.
CLAIM_GRACE_S = 30
# Beyond heartbeat_timeout_s + grace_seconds: the time a live flow gets to act on a silent worker
# itself (stop it, clean up on the host) before reconciliation takes the flow for wedged.
HEARTBEAT_MARGIN_S = 15


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
        timeout = config.model_training.heartbeat_timeout(run.backend)
        limit = timeout + config.model_training.grace_seconds + HEARTBEAT_MARGIN_S
        if run.heartbeat_at and now - run.heartbeat_at > limit:
            backend = config.model_training.backends.get(run.backend)
            silence = HeartbeatTimeout(run.backend, timeout,
                                       agent=backend is not None and not backend.type_info.on_this_machine)
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
        from potato.runs.prefect_api import release_leaked_slots

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
