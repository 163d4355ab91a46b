"""Stop what a run left running, and prove it: the door every end of a run goes through.

A run ends by its own flow, by the dispatcher that saw the flow's process
exit, or by reconciliation that found the flow gone or wedged (kill -9, the
OOM killer, a crashed server). In each case something the run started may
still be running, and the next run must not start beside it: ``stop``
stops each thing the store says the run started, checks that it is gone and
says what it did (``potato.runs.ending.end_run`` records the end only then).

Each backend type declares how what its runs leave is stopped (its
``leftovers``). Every declared stopper is asked, not only the one of the
run's backend's type today: the run's record, not the config (which may have
changed since), says what the run started, and a stopper with nothing
recorded for it answers at once. An agent backend declares none: its agent
learns from its next post that the run ended (the server refuses it) and
stops its worker, and nothing here can do more.
"""

from __future__ import annotations

import time

from potato.backend_types.contract import Stopped
from potato.backend_types.type_registry import BACKEND_TYPES, resolve
from potato.config import ProjectConfig
from potato.runs.store import Run, Store
from potato.training.stop_job import processes

# How long a process on this machine may take to be gone after SIGKILL.
LOCAL_WAIT_S = 5


def stop(config: ProjectConfig, store: Store, run: Run) -> Stopped:
    """Stop whatever *run* left running, on this machine and on its host; verify it is gone."""
    stoppers = dict.fromkeys(t.leftovers for t in BACKEND_TYPES.values() if t.leftovers)
    return joined([resolve(path)(config, store, run) for path in stoppers])


def joined(parts: list[Stopped]) -> Stopped:
    """Verified when every part is; what each said, in order."""
    return Stopped(all(p.verified for p in parts), "; ".join(p.said for p in parts if p.said))


def alive(pids: list[int]) -> list[int]:
    live = {pid for pid, _, _ in processes()}
    return [pid for pid in pids if pid in live]


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    """The ones of *pids* still alive after up to *seconds* of waiting for them to go."""
    deadline = time.monotonic() + seconds
    left = alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = alive(left)
    return left
