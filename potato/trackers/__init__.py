"""Experiment trackers: the annotation server reports each run to those ``model_training.report_to`` names.

The flow's report-to-trackers step, after record results and fetch artifacts: the run's numbers
and files are gathered once (``potato.trackers.tracked_run``, from the events and
files the server already has: a GPU host or an agent never needs a route to
a tracker, nor its credentials) and handed to each tracker in turn
(``mlflow_rest``, ``tensorboard``, ``weights_biases``). A tracker that is down, refuses or is
not installed is a warning in the run log naming the fix; the run is not
affected.
"""

from __future__ import annotations

import importlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from potato.backends.base import RunContext
from potato.config import ProjectConfig
from potato.errors import TrackerError
from potato.trackers import mlflow_rest, tensorboard, weights_biases
from potato.trackers.tracked_run import TrackedRun, gather

# Each name of ``report_to`` (config_keys.TRACKERS) and what reports to it; each returns its run log line.
REPORTERS: dict[str, Callable[[TrackedRun, ProjectConfig], str]] = {
    "mlflow": lambda run, config: mlflow_rest.report(run),
    "tensorboard": tensorboard.report,
    "wandb": weights_biases.report,
}

# The clients whose start is slow (wandb's import: 1-2 s on 2 cores, its service process 0.2 s): begun while
# the run trains, not after it. The flow's process is the run's own, so a service it started ends with it.
CLIENT_MODULES = {"tensorboard": "tensorboard.summary.writer.event_file_writer", "wandb": "wandb"}


def _start_quietly(name: str) -> None:
    try:
        module = importlib.import_module(CLIENT_MODULES[name])
        if name == "wandb":
            module.setup()
    except Exception:  # not installed, or broken: the report says so, with the fix, when it imports it again
        pass


def import_clients_early(names: tuple[str, ...]) -> None:
    """Start the clients of *names* in the background, so the report step does not wait for them."""
    for name in names:
        if name in CLIENT_MODULES:
            threading.Thread(target=_start_quietly, args=(name,), name=f"start {name}", daemon=True).start()


def report_to_trackers(ctx: RunContext) -> list[str]:
    """Report run *ctx* to each tracker of ``report_to``; return the run log's lines (warnings included)."""
    names = ctx.config.model_training.report_to
    if not names:
        return []
    started = time.monotonic()
    try:
        run = gather(ctx)
    except Exception as exc:  # what the run keeps is intact; only the report is lost
        ctx.log.warning(f"Not reported to {', '.join(names)}: gathering the run's numbers failed: "
                        f"{type(exc).__name__}: {exc}; the run is not affected")
        return []
    def one(name: str) -> tuple[bool, str]:
        try:
            return True, REPORTERS[name](run, ctx.config)
        except Exception as exc:  # a tracker never fails a run (its own bug included): the log says why
            return False, str(exc) if isinstance(exc, TrackerError) else f"{type(exc).__name__}: {exc}"

    # Each tracker waits on its own server or disk: they report side by side, their lines kept in order.
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        outcomes = list(pool.map(one, names))
    lines = []
    for name, (ok, text) in zip(names, outcomes):
        if ok:
            ctx.log.info(text)
            lines.append(text)
        else:
            ctx.log.warning(f"Not reported to {name}: {text}; the run is not affected")
            lines.append(f"{name}: {text}")
    ctx.log.info(f"Reported to {', '.join(names)} in {time.monotonic() - started:.2f} s")
    return lines
