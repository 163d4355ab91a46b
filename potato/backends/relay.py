"""Relay events: move the worker's events into the store and watch the run's limits.

The same loop serves every backend. Once a poll interval it asks the backend
for new events (the local backend tails events.jsonl; remote agents post theirs
to the server, which stores them as they come) and checks the store for a
cancel request, ``max_wall_seconds`` and heartbeat silence. The flow checks
the same limits (``check_limits``) between its steps before the worker runs.
"""

from __future__ import annotations

import errno
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from potato.backends.base import RunContext, Steps
from potato.errors import DiskFull, HeartbeatTimeout, RunCancelled, RunError, WallTimeExceeded
from potato.runs import run_events
from potato.runs.queue import cancelled_message
from potato.runs.runlog import last_line
from potato.runs.store import Run
from potato.training.events import read_events

POLL_SECONDS = 0.25
# A disk with less room than this left is full, for a run that failed writing to it (a model is larger).
DISK_FULL_BYTES = 1024 * 1024


class EventTail:
    """Reads the complete lines appended to an events.jsonl since the last read."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0

    def read_new(self) -> list[dict[str, Any]]:
        events, self.offset = read_events(str(self.path), self.offset)
        return events


def record_event(ctx: RunContext, event: dict[str, Any]) -> None:
    """Record one worker event (``potato.runs.run_events``), then run the flow's hooks for it."""
    run_events.record(ctx.store, ctx.run_id, ctx.log, event)
    kind = event.get("type")
    if kind == "progress":
        text, fraction = run_events.describe_progress(event)
        if ctx.on_progress is not None and fraction is not None:
            ctx.on_progress(fraction, text)
    elif kind == "done":
        ctx.done = event


def check_limits(ctx: RunContext, run: Run, now: float) -> RunError | None:
    """The limit *run* has reached, if any: a cancel request, then ``max_wall_seconds``."""
    if run.cancel_requested_at:
        return RunCancelled(cancelled_message(ctx.store, run.id))
    limit = ctx.config.model_training.max_wall_seconds
    if limit and now - (run.started_at or now) > limit:
        return WallTimeExceeded(limit)
    return None


def watch(
    ctx: RunContext,
    session: Any,
    handle: Any,
    backend: Steps,
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Relay events until the worker exits; return its exit code.

    Raises ``RunCancelled``, ``WallTimeExceeded`` or ``HeartbeatTimeout`` after
    stopping the worker (TERM, ``grace_seconds``, KILL).
    """
    mt = ctx.config.model_training
    heartbeat_timeout = mt.heartbeat_timeout(ctx.backend.name)
    started = ctx.run.started_at or clock()
    while True:
        code = backend.poll(ctx, session, handle)
        if code is not None:
            return code
        run = ctx.refresh()
        now = clock()
        limit = check_limits(ctx, run, now)
        if isinstance(limit, RunCancelled):
            ctx.log.info(f"Cancel requested: stopping the worker (SIGTERM, then SIGKILL after {mt.grace_seconds:g} s)")
        if limit is not None:
            backend.stop(ctx, session, handle, mt.grace_seconds)
            raise limit
        last_word = run.heartbeat_at or started
        if now - last_word > heartbeat_timeout:
            error = HeartbeatTimeout(ctx.backend.name, heartbeat_timeout, agent=not ctx.backend.type_info.on_this_machine)
            backend.stop(ctx, session, handle, 0)
            raise error
        sleep(POLL_SECONDS)


def describe_worker_failure(ctx: RunContext, code: int) -> str:
    """Why the worker ended with exit code *code*, in the words the run's error gets."""
    # A remote worker's events reach the store through the agent protocol, not this process.
    events = ctx.store.events(ctx.run_id)
    # An agent's result says why a job ended when the worker could not (e.g. SLURM ended it): first.
    result = next((e.data for e in reversed(events) if e.kind == "result"), {})
    if result.get("error"):
        return str(result["error"])
    done = ctx.done or next((e.data for e in reversed(events) if e.kind == "done"), {})
    # A worker on this machine writes into the run directory: its disk filling up is the server's, and then
    # the worker may not even have had room to say why it failed.
    if ctx.backend.type_info.on_this_machine and (f"[Errno {errno.ENOSPC}]" in str(done.get("error")) or
                                                  shutil.disk_usage(ctx.run_dir).free < DISK_FULL_BYTES):
        return str(DiskFull(ctx.run_dir))
    if done.get("error"):
        return str(done["error"])
    if code < 0:
        return f"The worker was killed by signal {-code}"
    tail = last_line(ctx.paths.worker_log)[:300]
    return f"The worker exited with code {code}" + (f": {tail}" if tail else "")
