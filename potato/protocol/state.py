"""What the protocol's routes remember between requests, and what a claim means for a run's state.

In memory, per app: which runs are claimed (a cache of the store's
``claimed`` events), the throttles on heartbeat and ``last_seen`` writes, and
bundle checksums. Nothing here must survive a restart: the claim is in the
store as an event and the highest stored event ``seq`` is the run's
``last_seq`` column.
"""

from __future__ import annotations

import threading
import time

from potato.config import ProjectConfig
from potato.runs.store import QUEUED, RUNNING, Run, Store

# The event the protocol stores when an agent claims a run (the agent backend's spawn step waits for it).
CLAIMED = "claimed"
# How often last_seen and the heartbeat are written at most (seconds).
TOUCH_INTERVAL_S = 1.0


def display_state(config: ProjectConfig, run: Run, claimed: bool) -> str:
    """The state a user sees: a run on an agent backend is ``queued`` until an agent claims it.

    The store has it ``running`` from the moment the dispatcher starts its
    flow (the flow holds the one-run-at-a-time slot while it waits for an agent).
    """
    backend = config.model_training.backends.get(run.backend)
    if run.state == RUNNING and backend is not None and backend.type_info.claimed_by_agent and not claimed:
        return QUEUED
    return run.state


class AgentState:
    """Per-app memory of the agent routes: claimed runs, write throttles, bundle checksums."""

    def __init__(self) -> None:
        self.lock = threading.Lock()          # one claim at a time: two agents never get one run
        self.claimed: set[int] = set()
        self._touched: dict[str, float] = {}
        self._beats: dict[int, float] = {}
        self.bundle_sums: dict[tuple[str, int, float], str] = {}

    def is_claimed(self, store: Store, run: Run) -> bool:
        """Whether an agent has claimed *run* (its ``claimed`` event exists)."""
        if run.id in self.claimed:
            return True
        if any(e.kind == CLAIMED for e in store.events(run.id)):
            self.claimed.add(run.id)
            return True
        return False

    def touch_token(self, store: Store, backend: str) -> None:
        now = time.monotonic()
        if now - self._touched.get(backend, -1e9) >= TOUCH_INTERVAL_S:
            self._touched[backend] = now
            store.touch_token(backend)

    def heartbeat(self, store: Store, run_id: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._beats.get(run_id, -1e9) >= TOUCH_INTERVAL_S:
            self._beats[run_id] = now
            store.heartbeat(run_id)
