"""What every backend's steps share: the run's context and the step interface.

A backend module in ``potato.tasks`` (``local``, ``ssh``, ``slurm``, ``agent``)
implements the steps of a run as plain functions, so they test without
Prefect; ``flows/training_run.py`` wraps each in a Prefect task:

    connect(ctx) -> session
    pick_gpu(ctx, session) -> str              the device or GPU the run will use
    sync_code(ctx, session) -> str             what was copied, for the run log
    spawn(ctx, session) -> handle
    poll(ctx, session, handle) -> int | None   relay new events; the exit code once known
    stop(ctx, session, handle, grace) -> None  TERM, grace, KILL — leaves nothing behind
    fetch_artifacts(ctx, session, handle) -> None
    clean_up(ctx, session, handle) -> None     always runs; must tolerate None arguments

A step that means nothing for a backend is a visible no-op that says so in
the run log, not a missing branch.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from potato.config import BackendConfig, ProjectConfig
from potato.errors import BackendError
from potato.runlog import RunLog
from potato.store import Run, Store

BACKEND_MODULES = {
    "local": "potato.tasks.local",
    "ssh": "potato.tasks.ssh",
    "slurm": "potato.tasks.slurm",
    "agent": "potato.tasks.agent",
}


@dataclass
class RunContext:
    """Everything a step needs to know about the run it works on."""

    config: ProjectConfig
    store: Store
    run: Run
    backend: BackendConfig
    log: RunLog
    extra: dict = field(default_factory=dict)

    @property
    def run_id(self) -> int:
        return self.run.id

    @property
    def run_dir(self) -> Path:
        return run_dir(self.config, self.run.id)

    @property
    def bundle_dir(self) -> Path:
        return self.run_dir / "bundle"

    @property
    def artifacts_dir(self) -> Path:
        return self.run_dir / "artifacts"

    def set_step(self, text: str, *, progress: float | None = None) -> None:
        """Show *text* in the run's step row, keep it as a ``step`` event, and log it."""
        self.store.update_run(self.run.id, step=text, progress=progress)
        self.store.add_event(self.run.id, "step", {"text": text})
        self.log.info(text[:1].upper() + text[1:])

    def refresh(self) -> Run:
        self.run = self.store.get_run(self.run.id)
        return self.run


def run_dir(config: ProjectConfig, run_id: int) -> Path:
    return config.training_dir / "runs" / str(run_id)


def backend_module(backend: BackendConfig) -> ModuleType:
    """The module in potato.tasks that implements *backend*'s steps."""
    name = BACKEND_MODULES.get(backend.type)
    if name is None or importlib.util.find_spec(name) is None:
        raise BackendError(
            f"Backend {backend.name!r} is a {backend.type} backend, which this version of Potato cannot run yet; "
            f"start the run on another backend")
    return importlib.import_module(name)
