"""Relay events: move the worker's events into the store and watch the run's limits.

The same loop serves every backend. Once a poll interval it asks the backend
for new events (the local backend tails events.jsonl; remote agents post theirs
to the server, which stores them as they come) and checks the store for a
cancel request, ``max_wall_seconds`` and heartbeat silence.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from potato import run_events
from potato.errors import HeartbeatTimeout, RunCancelled, WallTimeExceeded
from potato.tasks.base import RunContext
from potato.training.events import read_events

POLL_SECONDS = 0.25


class EventTail:
    """Reads the complete lines appended to an events.jsonl since the last read."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0

    def read_new(self) -> list[dict[str, Any]]:
        events, self.offset = read_events(str(self.path), self.offset)
        return events


def record_event(ctx: RunContext, event: dict[str, Any]) -> None:
    """Record one worker event (``potato.run_events``), then run the flow's hooks for it."""
    run_events.record(ctx.store, ctx.run_id, ctx.log, event)
    kind = event.get("type")
    if kind == "progress":
        hook = ctx.extra.get("on_progress")
        text, fraction = run_events.describe_progress(event)
        if hook is not None and fraction is not None:
            hook(fraction, text)
    elif kind == "done":
        ctx.extra["done"] = event


def watch(
    ctx: RunContext,
    session: Any,
    handle: Any,
    backend: ModuleType,
    *,
    heartbeat_timeout: float,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Relay events until the worker exits; return its exit code.

    Raises ``RunCancelled``, ``WallTimeExceeded`` or ``HeartbeatTimeout`` after
    stopping the worker (TERM, ``grace_seconds``, KILL).
    """
    mt = ctx.config.model_training
    started = ctx.run.started_at or clock()
    while True:
        code = backend.poll(ctx, session, handle)
        if code is not None:
            return code
        run = ctx.refresh()
        now = clock()
        if run.cancel_requested_at:
            ctx.log.info(f"Cancel requested: stopping the worker (SIGTERM, then SIGKILL after {mt.grace_seconds:g} s)")
            backend.stop(ctx, session, handle, mt.grace_seconds)
            raise RunCancelled("Cancelled by request")
        if mt.max_wall_seconds and now - started > mt.max_wall_seconds:
            error = WallTimeExceeded(mt.max_wall_seconds)
            backend.stop(ctx, session, handle, mt.grace_seconds)
            raise error
        last_word = run.heartbeat_at or started
        if now - last_word > heartbeat_timeout:
            error = HeartbeatTimeout(ctx.backend.name, heartbeat_timeout, agent=ctx.backend.type != "local")
            backend.stop(ctx, session, handle, 0)
            raise error
        sleep(POLL_SECONDS)
