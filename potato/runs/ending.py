"""Ending a run: ``end_run``, the one way a run ends, and only once what it started is gone.

A run ends by its own flow (its ``finally:``), by the dispatcher that saw its
flow's process exit, by reconciliation that found its flow gone or wedged, or
by the Prefect glue for a run no Prefect worker ever started. All of them
call ``end_run``, which first stops and checks what the run left running
(``potato.runs.stopping``): the next run must not start beside a worker
that may still train.
"""

from __future__ import annotations

import time

from potato.config import ProjectConfig
from potato.runs import stopping
from potato.runs.paths import run_paths
from potato.runs.runlog import RunLog
from potato.runs.store import END_STATES, Run, Store
from potato.training.client import UNREACHABLE_LIMIT_S

# How often reconciliation tries again to stop what a run left on a host it could not reach.
RETRY_STOP_S = 15
# Beyond UNREACHABLE_LIMIT_S and grace_seconds: when an unreachable agent has surely stopped its worker.
SELF_STOP_MARGIN_S = 30


def end_run(config: ProjectConfig, store: Store, run_id: int, state: str, error: str | None, *,
            log: RunLog | None = None) -> Run:
    """End run *run_id* as *state*, once nothing it started can still run: the one way a run ends.

    What the run left running is stopped and checked first (``stopping.stop``).
    When that cannot be verified (its host is unreachable) the run stays
    ``running``, its step row says why and ``ending`` keeps the end it will get,
    so the dispatcher starts no run beside a worker that may still train;
    reconciliation tries again every ``RETRY_STOP_S``. An agent that has not heard
    from the server for ``UNREACHABLE_LIMIT_S`` stops its worker by itself
    (docs/agent-protocol.md), so once that long has passed since the agent was
    last heard from, the run ends anyway, its error saying that stopping was
    not verified. A worker on this machine is always visible: there is no such limit.
    """
    run = store.get_run(run_id)
    if run.state in END_STATES:
        return run
    paths = run_paths(config, run_id)
    log = log or RunLog(store, run_id, paths.run_log)
    stopped = stopping.stop(config, store, run)
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
    _remove_partial_uploads(paths)
    store.transition(
        run_id, state, from_states=("queued", "running"), error=error, ending=None,
        step={"succeeded": "finished", "cancelled": "cancelled"}.get(state, "failed"),
    )
    return store.get_run(run_id)


def after_flow(config: ProjectConfig, store: Store, run_id: int, state) -> None:
    """Make sure a run whose flow ended is not left active (the flow may have died early)."""
    run = store.get_run(run_id)
    if run.state in END_STATES or run.ending:  # ended, or its end waits for a verified stop (reconcile)
        return
    message = getattr(state, "message", None) or "the flow ended before the run finished"
    end_run(config, store, run_id, "failed", f"The run's flow ended early: {message}")


def _remove_partial_uploads(paths) -> None:
    """An upload cut short by a killed flow (its own protocol server) leaves its temporary file: it goes."""
    for path in paths.dir.glob(paths.partial_upload_prefix() + "*"):
        path.unlink(missing_ok=True)


def _self_stop_deadline(config: ProjectConfig, run: Run) -> float | None:
    """When a remote run's agent will have stopped its worker by itself; None for a run on this machine."""
    backend = config.model_training.backends.get(run.backend)
    if not run.remote_job_dir and not run.slurm_job_id and (backend is None or backend.type_info.on_this_machine):
        return None
    last_word = run.heartbeat_at or run.started_at or time.time()
    return last_word + UNREACHABLE_LIMIT_S + config.model_training.grace_seconds + SELF_STOP_MARGIN_S
