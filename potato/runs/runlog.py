"""A run's log: one call writes the store (the page reads it), run.log and Prefect.

Code shared by the CLI and the flow logs through here; inside a flow the
Prefect run logger gets every line too, so the Prefect UI mirrors the run log.
A line may quote what a worker or an annotator's file said: it is escaped
once, here (``potato.training.escaping``), so a lone surrogate reaches every
copy as the same visible ``\\udXXX`` instead of failing the write.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from potato.runs.store import Store
from potato.training.escaping import escaped, open_text

_module_logger = logging.getLogger("potato.run")


def _prefect_logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        from prefect import get_run_logger
        from prefect.exceptions import MissingContextError
    except ImportError:  # pragma: no cover - prefect is a server-side dependency
        return _module_logger
    try:
        return get_run_logger()
    except MissingContextError:
        return _module_logger


class RunLog:
    """Writes log lines of one run to the store, ``run.log`` and the Prefect run logger."""

    LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

    def __init__(self, store: Store, run_id: int, path: Path, *, mirror_to_prefect: bool = True):
        self.store = store
        self.run_id = run_id
        self.path = path
        # Off for events that arrive over HTTP: a request thread has no Prefect run to log to.
        self.mirror_to_prefect = mirror_to_prefect

    def write(self, level: str, message: str, *, source: str = "potato") -> None:
        level = level if level in self.LEVELS else "info"
        message = escaped(message)
        if level != "debug":
            self.store.add_event(self.run_id, "log", {"level": level, "message": message, "source": source})
        self.echo(level, message)

    def echo(self, level: str, message: str) -> None:
        """Write the line to ``run.log`` and Prefect only: its store event is written by the caller."""
        level = level if level in self.LEVELS else "info"
        message = escaped(message)
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open_text(self.path, "a") as fh:
                fh.write(f"{stamp} {level.upper():7} {message}\n")
        except OSError as exc:  # a full disk: the store keeps the line, and the run must still end with its reason
            _module_logger.warning("run %s: run.log not written (%s): %s", self.run_id, exc, message)
        if self.mirror_to_prefect:
            _prefect_logger().log(self.LEVELS[level], message)

    def debug(self, message: str) -> None:
        self.write("debug", message)

    def info(self, message: str) -> None:
        self.write("info", message)

    def warning(self, message: str) -> None:
        self.write("warning", message)

    def error(self, message: str) -> None:
        self.write("error", message)


def last_line(path: Path) -> str:
    """The last line of the log file *path* that is not blank; "" when there is none (or no file)."""
    try:
        lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""
