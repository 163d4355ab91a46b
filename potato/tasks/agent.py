"""The agent backend (SPEC §7): a machine the server cannot reach polls it for work.

Someone runs ``potato training agent --server URL --backend NAME`` on the
training machine; it claims the run through the server's agent protocol,
downloads the bundle, runs the worker and posts everything back. So the
flow's steps here mostly wait: for an agent to claim the run (at most
``queue_timeout_s``), then for its result. The model stays on the agent's
machine; ``artifact_uri`` says where.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass

from potato.errors import AgentError, RunCancelled
from potato.tasks.base import RunContext

CLAIMED = "claimed"  # the event the agent protocol stores when an agent claims a run
WAIT_SECONDS = 0.5
STOP_MARGIN_S = 2.0


@dataclass
class AgentSession:
    backend: str


@dataclass
class AgentHandle:
    claimed_by: dict


class NoAgent(AgentError):
    """Raised when no agent claims a run within ``queue_timeout_s``."""

    def __init__(self, backend: str, seconds: float):
        super().__init__(
            f"No agent asked for work on backend {backend!r} within {seconds:g} s. Fix: start one on the "
            f"training machine with `potato training agent --server URL --backend {backend}` "
            f"(its token comes from `potato training register {backend} config.yaml`)")


def connect(ctx: RunContext) -> AgentSession:
    ctx.log.info(f"Agent backend {ctx.backend.name!r}: the agent connects to this server; nothing to connect to")
    return AgentSession(backend=ctx.backend.name)


def pick_gpu(ctx: RunContext, session: AgentSession) -> str:
    ctx.log.info("The agent's worker picks the device on its own machine")
    return "picked by the agent"


def sync_code(ctx: RunContext, session: AgentSession) -> str:
    ctx.log.info("The agent runs the Potato installed on its machine; nothing to copy")
    return "nothing to copy"


def _claim(ctx: RunContext) -> dict | None:
    for event in ctx.store.events(ctx.run_id):
        if event.kind == CLAIMED:
            return event.data
    return None


def spawn(ctx: RunContext, session: AgentSession) -> AgentHandle:
    """Wait until an agent of this backend claims the run (SPEC §7: the run stays queued till then)."""
    from potato.project import pack_bundle

    pack_bundle(ctx.bundle_dir, ctx.run_dir / "bundle.tar.gz")
    limit = ctx.backend.get("queue_timeout_s")
    ctx.set_step(f"waiting for an agent of {session.backend} to ask for work")
    started = time.monotonic()
    while True:
        claim = _claim(ctx)
        if claim is not None:
            where = claim.get("host") or claim.get("address") or "an agent"
            ctx.log.info(f"The agent on {where} claimed the run")
            ctx.set_step(f"training on the agent's machine ({where})")
            return AgentHandle(claimed_by=claim)
        run = ctx.refresh()
        if run.cancel_requested_at or run.state != "running":
            raise RunCancelled("Cancelled while waiting for an agent")
        if limit and time.monotonic() - started > float(limit):
            raise NoAgent(session.backend, float(limit))
        # Waiting for an agent is not the agent's silence: the heartbeat starts with the claim.
        ctx.store.heartbeat(ctx.run_id)
        time.sleep(WAIT_SECONDS)


def poll(ctx: RunContext, session: AgentSession, handle: AgentHandle) -> int | None:
    try:
        return int((ctx.run_dir / "exit_code").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def stop(ctx: RunContext, session: AgentSession, handle: AgentHandle, grace: float) -> None:
    """The cancel reaches the agent as the answer to its next post; give it *grace* to report."""
    deadline = time.monotonic() + grace + STOP_MARGIN_S
    while time.monotonic() < deadline and poll(ctx, session, handle) is None:
        time.sleep(WAIT_SECONDS)


def fetch_artifacts(ctx: RunContext, session: AgentSession, handle: AgentHandle) -> None:
    uri = ctx.refresh().artifact_uri
    ctx.log.info(f"The model stays on the agent's machine: {uri}" if uri else "The agent reported no artifacts")


def clean_up(ctx: RunContext, session: AgentSession | None, handle: AgentHandle | None) -> None:
    shutil.rmtree(ctx.bundle_dir, ignore_errors=True)
    (ctx.run_dir / "bundle.tar.gz").unlink(missing_ok=True)
