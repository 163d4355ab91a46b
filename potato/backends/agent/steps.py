"""The agent backend's steps and check: a machine the server cannot reach polls it for work.

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

from potato.backend_types.contract import CheckReport
from potato.backends.base import RunContext
from potato.bundle.pack import pack_bundle
from potato.config import BackendConfig, ProjectConfig
from potato.errors import NoAgent, RunCancelled
from potato.protocol.state import CLAIMED
from potato.runs.paths import open_store
from potato.runs.store import Store

WAIT_SECONDS = 0.5
STOP_MARGIN_S = 2.0


@dataclass
class AgentSession:
    backend: str


@dataclass
class AgentHandle:
    claimed_by: dict


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
    """Wait until an agent of this backend claims the run (to its user, the run stays queued till then)."""
    pack_bundle(ctx.bundle_dir, ctx.paths.bundle_archive)
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
    """The exit code the agent reported (the protocol's result route writes it into the run directory)."""
    return ctx.paths.read_exit_code()


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
    ctx.paths.bundle_archive.unlink(missing_ok=True)


def _when(stamp: float | None, now: float) -> str:
    if stamp is None:
        return "never"
    text = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))
    age = max(0, int(now - stamp))
    return f"{text} ({age} s ago)"


def check(config: ProjectConfig, backend: BackendConfig, *,
          store: Store | None = None, now: float | None = None) -> CheckReport:
    """``potato training check NAME`` for an agent backend: its token record.

    Before any registration: ``no token issued yet`` and the register command
    to run, and the report is not ok (no agent can take the backend's runs).
    """
    if store is None:
        store = open_store(config)
    now = time.time() if now is None else now
    record = store.get_token(backend.name)
    if record is None:
        command = f"potato training register {backend.name} {config.path}"
        return CheckReport(
            backend=backend.name, type=backend.type, ok=False,
            lines=[f"{backend.name}: no token issued yet", f"Issue one with: {command}"],
            data={"token": None, "register_command": command},
        )
    lines = [
        f"{backend.name}: agent backend; token issued {_when(record.created_at, now)}",
        f"last_seen: {_when(record.last_seen, now)}",
    ]
    if record.last_seen is None:
        lines.append("No agent has connected with this token yet; start one on the training "
                     f"machine: potato training agent --server URL --backend {backend.name}")
    return CheckReport(
        backend=backend.name, type=backend.type, ok=True, lines=lines,
        data={"token": {"created_at": record.created_at, "last_seen": record.last_seen}},
    )
