"""Run a function in a forked child process and take its result back: the bundle's second core.

Building a 1 M-item bundle is a few seconds of CPU in one process; parsing the
annotators' ``user_state.json`` files is a third of it, and each file's parse
is pure work on a path (``potato.annotations.labels.read_votes``). A forked child starts
in about a millisecond with every module imported and its arguments already
in memory, where a spawned interpreter would spend 50-100 ms importing them
again, which is why this forks rather than spawns.

Forking a process that has other threads (Prefect's, the server's) is safe
here because of what the child does and does not do: it runs only the given
function on plain data (no imports, no logging, no lock another thread could
hold), writes one pickle to a pipe, and leaves with ``os._exit``, so no atexit
handler, buffered file or finaliser of the parent runs twice. It stays in the
parent's process group, so cancelling a run's process group stops it too, and
``close`` (or leaving the ``with`` block) kills and reaps one still running,
so none outlives the build.

Anything that goes wrong (no ``os.fork`` on this platform, the function
raising, the child dying, a result that does not unpickle) raises
``ForkFailed``, and the caller does the work itself: a child can make the
work faster, never different. Linux only: macOS's system libraries are not
safe to use after ``fork`` (CPython's multiprocessing stopped forking there).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from typing import Any, Callable


class ForkFailed(Exception):
    """The child gave no result; do the work in this process instead."""


def can_fork() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "fork")


class Forked:
    """``fn(*args)`` running in a forked child; ``result()`` waits for its return value."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        if not can_fork():
            raise ForkFailed("no fork on this platform")
        read_fd, write_fd = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            raise ForkFailed(f"fork failed: {exc}") from exc
        if pid == 0:  # the child: nothing of the parent's may run here but fn
            status = 1
            try:
                os.close(read_fd)
                _write_all(write_fd, pickle.dumps(fn(*args), protocol=pickle.HIGHEST_PROTOCOL))
                status = 0
            finally:
                os._exit(status)
        os.close(write_fd)  # before any other fork, so that only this child holds it
        self.pid: int | None = pid
        self.read_fd: int | None = read_fd

    def result(self) -> Any:
        """The child's return value; raises ``ForkFailed`` when there is none."""
        if self.pid is None:
            raise ForkFailed("already closed")
        chunks = []
        while chunk := os.read(self.read_fd, 1 << 20):
            chunks.append(chunk)
        status = self._reap()
        self._close_pipe()
        if status is not None and (not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0):
            raise ForkFailed(f"the child ended with status {status}")
        try:  # a child cut short leaves a pickle that does not load
            return pickle.loads(b"".join(chunks))
        except Exception as exc:  # noqa: BLE001 - any broken result means: do it here
            raise ForkFailed(f"the child's result does not unpickle: {exc}") from exc

    def close(self) -> None:
        """Kill the child if it still runs, and reap it."""
        if self.pid is not None:
            pid, self.pid = self.pid, None
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == 0:  # still running, and still ours to signal
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            except ChildProcessError:
                pass  # reaped elsewhere: its pid may be another process's by now
        self._close_pipe()

    def _reap(self) -> int | None:
        """Wait for the child; its status, or None when something else in this process
        (a ``waitpid(-1)`` child watcher) reaped it first."""
        pid, self.pid = self.pid, None
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return None

    def _close_pipe(self) -> None:
        if self.read_fd is not None:
            os.close(self.read_fd)
            self.read_fd = None

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
