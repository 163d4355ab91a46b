"""The embedded Prefect API: one local ``prefect server start`` per project, reused.

Why: with no ``PREFECT_API_URL``, every Prefect client process starts its own
temporary server (6.5–15 s per process, no UI) and a holder killed with -9
leaks the concurrency slot for good. So when
``PREFECT_API_URL`` is unset Potato starts ONE ``prefect server start`` (with
the UI) under ``<training_dir>/prefect`` and every run, flow process and CLI
command of the project talks to it. When ``PREFECT_API_URL`` is set, that
server is used and nothing is started.

Files under ``<training_dir>/prefect/`` (its ``PREFECT_HOME``):

- ``api.json`` — ``{"url", "pid", "port", "started_at", "log"}`` of the live
  server, written atomically. Another process on the same project reuses the
  server it names when the pid is alive AND ``/api/health`` answers;
  otherwise it is stale and replaced.
- ``api.lock`` — held (flock) while checking and starting, so two processes
  starting at once end up with one server.
- ``server.log`` — the server's stdout and stderr.
- ``prefect.db`` — the server's SQLite database.

Public API: ``embedded_prefect``, ``start_embedded``, ``EmbeddedServer``,
``install_sigterm_exit``, ``ensure_concurrency_limit``,
``release_leaked_slots``; pure builders ``build_server_argv``,
``build_server_env``, ``ui_url_for``; ``prefect_home``, ``read_state``,
``is_healthy``.

This module imports ``prefect`` only inside the functions that talk to the
API, so starting or reusing the server costs no Prefect import.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from potato.errors import PrefectApiError
from potato.training import atomic_files

log = logging.getLogger(__name__)

# Every project's concurrency limit is named LIMIT_NAME-<project> (potato.runs.prefect_runs).
LIMIT_NAME = "potato-training"

# Measured here: healthy after 4–10 s on a warm DB, 13–15 s on a fresh one;
# two busy cores can double that.
START_DEADLINE_S = 90.0
# How long a second process waits for the one starting the server.
LOCK_DEADLINE_S = START_DEADLINE_S + 30.0
HEALTH_TIMEOUT_S = 2.0
STOP_GRACE_S = 10.0
# A free port can be taken between our probe and the server's bind; retry.
START_ATTEMPTS = 3


# API URL -> PREFECT_HOME of the embedded servers this process started or
# reused, so release_leaked_slots can find their lease files unasked.
_HOMES: dict[str, Path] = {}


@dataclass
class EmbeddedServer:
    """A Prefect API this process uses; ``owned`` when this process started it.

    ``stop()`` stops an owned server (TERM to its process group, then KILL)
    and is a no-op for a reused or external one.
    """

    url: str
    home: Path | None = None
    pid: int | None = None
    owned: bool = False
    log_path: Path | None = None
    _process: subprocess.Popen | None = field(default=None, repr=False)
    _env_token: tuple | None = field(default=None, repr=False)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the server if this process started it; restore ``PREFECT_API_URL``."""
        if self.owned and self.pid is not None:
            atexit.unregister(self.stop)
            # Drain while PREFECT_API_URL still names this server.
            _drain_prefect_workers()
            _stop_process_group(self.pid, self._process, grace_s)
            state = read_state(self.home) if self.home else None
            if state and state.get("pid") == self.pid:
                try:
                    (self.home / "api.json").unlink()
                except FileNotFoundError:
                    pass
            self.owned = False
        if self._env_token is not None:
            _restore_api_url(self._env_token)
            self._env_token = None


# -- pure builders ------------------------------------------------------------

def prefect_home(training_dir: str | os.PathLike) -> Path:
    """Return the embedded server's ``PREFECT_HOME``: ``<training_dir>/prefect``."""
    return Path(training_dir) / "prefect"


def build_server_argv(port: int, python: str | None = None) -> list[str]:
    """Return the argv that runs the Prefect API server (with UI) on 127.0.0.1:*port*."""
    return [python or sys.executable, "-m", "prefect", "server", "start",
            "--host", "127.0.0.1", "--port", str(port)]


def build_server_env(home: Path, url: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """Return the environment of the server at *url*: *base* (default ``os.environ``) plus our settings."""
    env = dict(os.environ if base is None else base)
    # The server must not think it is a client of some other API.
    env.pop("PREFECT_API_URL", None)
    env.update({
        "PREFECT_HOME": str(home),
        # The UI asks /ui-settings where its API is. `prefect server start --port`
        # does not tell it: left alone, the UI calls 127.0.0.1:4200 and shows
        # "Can't connect to Server API".
        "PREFECT_SERVER_UI_API_URL": url,
        # Offline machines: without these the server logs telemetry errors (measured).
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
        # Leases on disk: a server restart while a run holds the slot would
        # otherwise leak the slot (notes, "Concurrency limit of one").
        "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE":
            "prefect.server.concurrency.lease_storage.filesystem",
        # server.log is read by people: no colour codes, no buffering.
        "PREFECT_CLI_COLORS": "false",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def api_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/api"


def ui_url_for(api: str | None, environ: dict[str, str] | None = None) -> str | None:
    """Return the Prefect UI's URL for the API at *api*: ``PREFECT_UI_URL`` if set, else *api* less ``/api``.

    ``PREFECT_UI_URL`` is Prefect's own setting, for a UI reached at another
    address than its API (a reverse proxy).
    """
    explicit = (os.environ if environ is None else environ).get("PREFECT_UI_URL")
    if explicit:
        return explicit.rstrip("/")
    if not api:
        return None
    url = api.rstrip("/")
    return url[: -len("/api")] if url.endswith("/api") else url


# -- state file, health ---------------------------------------------------------

def read_state(home: Path) -> dict | None:
    """Return ``api.json`` under *home* as a dict, or None when absent or unreadable."""
    try:
        return json.loads((Path(home) / "api.json").read_text())
    except (OSError, ValueError):
        return None


def _write_state(home: Path, state: dict) -> None:
    # Readers must never see half a file: a temporary file, then a rename.
    atomic_files.write_text(Path(home) / "api.json", json.dumps(state, indent=2))


def is_healthy(url: str, timeout: float = HEALTH_TIMEOUT_S) -> bool:
    """Return whether the Prefect API at *url* answers ``GET /health`` with 200."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _locked(path: Path, deadline_s: float) -> Iterator[None]:
    """Hold an exclusive flock on *path*, waiting at most *deadline_s*."""
    with open(path, "a") as handle:
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise PrefectApiError(
                        f"Another process has been starting the Prefect API under "
                        f"{str(path.parent)!r} for over {deadline_s:g} seconds; "
                        f"see {str(path.parent / 'server.log')!r}"
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# -- PREFECT_API_URL for this process and its children --------------------------

def _set_api_url(url: str) -> tuple:
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    _refresh_prefect_settings()
    return (previous,)


def _restore_api_url(token: tuple) -> None:
    (previous,) = token
    if previous is None:
        os.environ.pop("PREFECT_API_URL", None)
    else:
        os.environ["PREFECT_API_URL"] = previous
    _refresh_prefect_settings()


def _refresh_prefect_settings() -> None:
    # Prefect reads the environment once, at import (its global settings
    # context); an already-imported prefect would keep using no API URL and
    # start a temporary server. Measured: get_client() after setting the
    # variable still went to a temporary server without this refresh.
    context = sys.modules.get("prefect.context")
    if context is not None:
        context.refresh_global_settings_context()


# -- start and stop ---------------------------------------------------------------

def start_embedded(training_dir: str | os.PathLike, *, set_env: bool = True,
                   deadline_s: float = START_DEADLINE_S) -> EmbeddedServer:
    """Return a Prefect API for this project, starting one only if needed.

    Uses ``PREFECT_API_URL`` when set (starts nothing); else reuses the live,
    healthy server named by ``<training_dir>/prefect/api.json``; else starts
    ``prefect server start`` in its own session, logging to ``server.log``,
    and waits for ``/api/health`` up to *deadline_s*. With *set_env*,
    ``PREFECT_API_URL`` is set for this process and its children until
    ``stop()``. A server this process started is also stopped at exit
    (``atexit``; see ``install_sigterm_exit`` for SIGTERM).

    Raises ``PrefectApiError`` (naming the log file) when the server does not
    come up in time.
    """
    external = os.environ.get("PREFECT_API_URL")
    if external:
        return EmbeddedServer(url=external)

    home = prefect_home(training_dir)
    home.mkdir(parents=True, exist_ok=True)
    with _locked(home / "api.lock", LOCK_DEADLINE_S):
        state = read_state(home)
        if state and _pid_alive(state.get("pid", -1)) and is_healthy(state.get("url", "")):
            log.debug("Reusing the Prefect API at %s (pid %s)", state["url"], state["pid"])
            server = EmbeddedServer(url=state["url"], home=home, pid=state["pid"],
                                    log_path=home / "server.log")
        else:
            server = _start(home, deadline_s)
            _write_state(home, {
                "url": server.url, "pid": server.pid, "port": urllib.parse.urlsplit(server.url).port,
                "started_at": time.time(), "log": str(server.log_path),
            })
            atexit.register(server.stop)
    _HOMES[server.url] = home
    if set_env:
        server._env_token = _set_api_url(server.url)
    return server


def _start(home: Path, deadline_s: float) -> EmbeddedServer:
    log_path = home / "server.log"
    last_failure = ""
    for _attempt in range(START_ATTEMPTS):
        port = _free_port()
        argv = build_server_argv(port)
        url = api_url(port)
        env = build_server_env(home, url)
        with open(log_path, "ab") as log_file:
            log_file.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} "
                           f"pid {os.getpid()} starts: {' '.join(argv)}\n".encode())
            log_file.flush()
            log.debug("Starting the Prefect API: %s", " ".join(argv))
            # Own session: SIGINT at the terminal does not reach it, and stop()
            # can signal the whole group.
            process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                       stdout=log_file, stderr=subprocess.STDOUT,
                                       start_new_session=True, cwd=home)
        started = time.monotonic()
        deadline = started + deadline_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                last_failure = f"it exited with status {process.returncode}"
                break
            if is_healthy(url, timeout=HEALTH_TIMEOUT_S):
                log.info("Prefect API at %s healthy after %.1f s (pid %d, log %s)",
                         url, time.monotonic() - started, process.pid, log_path)
                return EmbeddedServer(url=url, home=home, pid=process.pid, owned=True,
                                      log_path=log_path, _process=process)
            time.sleep(0.2)
        else:
            _stop_process_group(process.pid, process, STOP_GRACE_S)
            raise PrefectApiError(
                f"The Prefect API server did not become healthy at {url} within "
                f"{deadline_s:g} seconds; see {str(log_path)!r}"
            )
    raise PrefectApiError(
        f"The Prefect API server could not start ({last_failure}, "
        f"{START_ATTEMPTS} attempts); see {str(log_path)!r}"
    )


def _drain_prefect_workers(timeout_s: float = 5.0) -> None:
    """Send the logs and events Prefect still queues in this process, before the API goes.

    Measured: stopping the server right after a flow left the process
    retrying ("--- Error logging to API --- All connection attempts failed")
    for 80 s at exit. prefect_test_harness drains the same two workers.
    """
    if "prefect" not in sys.modules:
        return
    try:
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=timeout_s)
        EventsWorker.drain_all(timeout=timeout_s)
    except Exception as exc:  # best effort: the server is going away anyway
        log.debug("Draining Prefect's log and event workers failed: %s", exc)


def _stop_process_group(pid: int, process: subprocess.Popen | None, grace_s: float) -> None:
    """TERM the process group *pid* leads, wait up to *grace_s*, then KILL it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if process is not None:
                if process.poll() is not None:
                    # The leader is gone; make sure no grandchild stays behind.
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    return
            elif not _pid_alive(pid):
                return
            time.sleep(0.1)
        log.warning("Prefect API server (pid %d) ignored %s for %g s", pid, sig.name, grace_s)
    if process is not None:
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass


@contextmanager
def embedded_prefect(training_dir: str | os.PathLike) -> Iterator[str]:
    """Yield the API URL of the project's Prefect API, started if needed.

    Sets ``PREFECT_API_URL`` for this process and its children while inside;
    stops the server on exit only if this process started it.
    """
    server = start_embedded(training_dir, set_env=True)
    try:
        yield server.url
    finally:
        server.stop()


def install_sigterm_exit() -> None:
    """Make SIGTERM exit normally (``sys.exit(0)``) so ``finally`` and ``atexit`` run.

    Without it, a process owning the server and stopped with SIGTERM leaves
    the server orphaned (notes, "Where the API lives"). Call from the main
    thread (Python only installs handlers there).
    """
    signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum, frame) -> None:
    sys.exit(0)


# -- the concurrency limit --------------------------------------------------------

def ensure_concurrency_limit(name: str, limit: int = 1) -> None:
    """Create the global concurrency limit *name* with *limit* slots if missing (or fix it).

    Uses the client API: ``prefect gcl create`` costs seconds more per call.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import (
        GlobalConcurrencyLimitCreate,
        GlobalConcurrencyLimitUpdate,
    )
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            existing = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=limit, active=True))
            except ObjectAlreadyExists:
                pass  # another process created it first
            return
        if existing.limit != limit or not existing.active:
            client.update_global_concurrency_limit(
                name, GlobalConcurrencyLimitUpdate(limit=limit, active=True))


def release_leaked_slots(name: str, *, home: str | os.PathLike | None = None) -> int:
    """Set the active slots of limit *name* to 0; return how many were taken.

    Only call this when the store says no run is active (reconciliation after
    a crash): a holder killed with -9 keeps its slot until its lease expires,
    or forever on a temporary server (measured).

    With *home* (the embedded server's ``PREFECT_HOME``; by default that of
    the embedded server this process uses, if any), the leaked leases on this
    limit are revoked too. Otherwise the server's lease reaper would later
    free "their" slot again while a new run holds it, and a second run could
    start beside it. An external API's leases cannot be read; they expire.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            existing = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return 0
        if home is None:
            home = _HOMES.get(os.environ.get("PREFECT_API_URL", ""))
        if home is not None:
            for lease_id in _lease_ids_for(Path(home), str(existing.id)):
                try:
                    client.release_concurrency_slots_with_lease(lease_id)
                except Exception as exc:  # an expired/revoked lease: nothing to free
                    log.debug("Lease %s of %r not released: %s", lease_id, name, exc)
        client.update_global_concurrency_limit(
            name, GlobalConcurrencyLimitUpdate(active_slots=0))
        return int(existing.active_slots)


def _lease_ids_for(home: Path, limit_id: str) -> list:
    """Return the ids of the filesystem leases under *home* that hold limit *limit_id*."""
    from uuid import UUID

    ids = []
    for path in sorted((home / "concurrency_leases").glob("*.json")):
        if path.name == "expirations.json":
            continue
        try:
            lease = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if limit_id in lease.get("resource_ids", []):
            ids.append(UUID(lease["id"]))
    return ids
