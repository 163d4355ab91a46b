"""What every backend's steps share: the run's context, and the steps' contract (``Steps``).

A backend type's steps module (``potato.backends.<type>.steps``; its
declaration names it) implements the steps of a run as plain functions, so
they test without Prefect; ``flows/training_run.py`` wraps each in a Prefect
task. ``Steps`` says what each takes and returns; a unit test holds every
registered type's module to it.

A step that means nothing for a backend is a visible no-op that says so in
the run log, not a missing branch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from potato.backend_types.type_registry import resolve
from potato.config import BackendConfig, ProjectConfig
from potato.runs.paths import RunPaths, run_paths
from potato.runs.runlog import RunLog
from potato.runs.store import Run, Store


@dataclass
class RunContext:
    """Everything a step needs to know about the run it works on."""

    config: ProjectConfig
    store: Store
    run: Run
    backend: BackendConfig
    log: RunLog
    # The flow's hook for each progress event: (fraction done, step row text), e.g. its Prefect artifact.
    on_progress: Callable[[float, str], None] | None = None
    # The worker's `done` event, once the relay has seen it (why a worker failed, when it says).
    done: dict | None = None
    # Which try of a retried step this is, for its step row: "" the first time, " (attempt 2 of 3)" after.
    attempt: str = ""

    @property
    def run_id(self) -> int:
        return self.run.id

    @property
    def paths(self) -> RunPaths:
        return run_paths(self.config, self.run.id)

    @property
    def run_dir(self) -> Path:
        return self.paths.dir

    @property
    def bundle_dir(self) -> Path:
        return self.paths.bundle

    @property
    def artifacts_dir(self) -> Path:
        return self.paths.artifacts

    def set_step(self, text: str, *, progress: float | None = None) -> None:
        """Show *text* in the run's step row, keep it as a ``step`` event, and log it."""
        self.store.update_run(self.run.id, step=text, progress=progress)
        self.store.add_event(self.run.id, "step", {"text": text})
        self.log.info(text[:1].upper() + text[1:])

    def refresh(self) -> Run:
        self.run = self.store.get_run(self.run.id)
        return self.run


@runtime_checkable
class Steps(Protocol):
    """The steps of a run on one type of backend, in the order the flow calls them.

    ``session`` is what ``connect`` returned, ``handle`` what ``spawn`` did;
    each is the backend's own type. ``clean_up`` always runs, after a failure
    too, so it takes None for what was never made.
    """

    def connect(self, ctx: RunContext) -> Any:
        """Open what the run talks to its worker through."""

    def pick_gpu(self, ctx: RunContext, session: Any) -> str:
        """Choose the device or GPUs the run uses; say which."""

    def sync_code(self, ctx: RunContext, session: Any) -> str:
        """Put this version of the remote half where the worker runs; say what was copied."""

    def spawn(self, ctx: RunContext, session: Any) -> Any:
        """Start the worker (or the agent that runs it)."""

    def poll(self, ctx: RunContext, session: Any, handle: Any) -> int | None:
        """Relay new events; the worker's exit code once it is known."""

    def stop(self, ctx: RunContext, session: Any, handle: Any, grace: float) -> None:
        """TERM, *grace* seconds, KILL: leave nothing of the worker running."""

    def fetch_artifacts(self, ctx: RunContext, session: Any, handle: Any) -> None:
        """Bring the model files into the run directory, or say where they stay."""

    def clean_up(self, ctx: RunContext, session: Any | None, handle: Any | None) -> None:
        """Remove what the run made; close what it opened."""


def steps_of(backend: BackendConfig) -> Steps:
    """The steps of *backend*'s type (the module its declaration names)."""
    return resolve(backend.type_info.steps)
