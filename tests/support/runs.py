"""Helpers for tests that run real training runs: a tiny project, the CLI, waiting on the store."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from potato.runs.store import Run, Store
from tests.support.potato_project import DEFAULT_LABELS, item_text, make_project, true_label, write_user_state
from tests.support.tiny_model import build_tiny_model

POTATO = str(Path(sys.executable).with_name("potato"))


def tiny_project(root: Path, n_items: int = 60, *, trainer: Mapping[str, Any] | None = None,
                 **model_training: Any) -> Path:
    """A Potato project whose trainer is a tiny random BERT built on its own texts."""
    texts = [item_text(i, true_label(i)) for i in range(n_items)]
    model = build_tiny_model(root / "tiny-model", texts)
    options = {"model": str(model), "epochs": 10, "learning_rate": 3e-3, "batch_size": 8, "max_length": 32}
    options.update(trainer or {})
    mt = {
        "enabled": True,
        "max_wall_seconds": 600,
        "writeback": {"schemas": ["sentiment"], "include_unlabeled": True, "min_confidence": 0.5},
        "trainers": {"hf-text-classification": options},
    }
    mt.update(model_training)
    return make_project(root, n_items=n_items, labeled_fraction=0.9, model_training=mt)


def every_fourth(i: int) -> bool:
    """Item i is among the quarter that :func:`noisy_tiny_project` labels wrongly by default."""
    return i % 4 == 0


def noisy_tiny_project(root: Path, n_items: int, holdout_fraction: float, annotators: tuple[str, ...] = ("alice",),
                       wrong: Callable[[int], bool] = every_fourth, **model_training: Any) -> Path:
    """A tiny project whose every item is labelled, by each of *annotators* alike, wrongly where *wrong* says.

    The tiny BERT trains long enough (25 epochs) to be sure of itself, so it is over-confident on the holdout:
    sure (~0.99) and right only where the labels are — what a calibration must correct. The gate is off: a
    noisy annotator's model may not beat the majority label clearly (tests/unit/test_quality_gate.py is the
    gate's).
    """
    labels = {f"r{i}": DEFAULT_LABELS[(DEFAULT_LABELS.index(true_label(i)) + wrong(i)) % 2] for i in range(n_items)}
    model_training.setdefault("writeback", {"schemas": ["sentiment"], "include_unlabeled": True,
                                            "min_confidence": 0.5, "gate": False})
    config = tiny_project(root, n_items=n_items, trainer={"epochs": 25, "batch_size": 16},
                          holdout_fraction=holdout_fraction, **model_training)
    out = config.parent / "annotation_output"
    for user in out.glob("*/user_state.json"):
        user.unlink()
    for user in annotators:
        write_user_state(out, user, {item: {"sentiment": label} for item, label in labels.items()})
    return config


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(process: subprocess.Popen, grace: float) -> None:
    """SIGTERM *process*'s group (it leads one: ``start_new_session``), SIGKILL it after *grace* seconds."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@contextmanager
def served(config, *, background: bool = True) -> Iterator[str]:
    """``potato start`` in this process: the app on waitress, on a free loopback port, with its dispatcher
    (*background* False: without it, so that a queued run stays queued and no Prefect API is needed).

    Yields the base URL; afterwards the server is closed and the dispatcher stopped.
    """
    from potato.server import create_app
    from potato.server.commands import make_server, training_page

    app = create_app(config, start_background=background)
    port = free_port()
    wsgi = make_server(app, "127.0.0.1", port, "waitress")
    training_page(config, "127.0.0.1", port)
    thread = threading.Thread(target=wsgi.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        wsgi.close()
        if background:
            app.extensions["potato.background"].stop()
        thread.join(5)


def store_of(config_yaml: Path) -> Store:
    return Store(config_yaml.parent / "annotation_output" / "training" / "runs.db")


def run_dir_of(config_yaml: Path, run_id: int) -> Path:
    return config_yaml.parent / "annotation_output" / "training" / "runs" / str(run_id)


def potato(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run the real ``potato`` console script; HF offline, Prefect from the session fixture."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([POTATO, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL, **kwargs)


def potato_watching(sample: Callable[[], None], *args: str, interval: float = 0.1) -> subprocess.CompletedProcess:
    """``potato(*args)`` while a thread calls *sample* every *interval* seconds (to see what a run leaves about)."""
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            sample()
            time.sleep(interval)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        return potato(*args)
    finally:
        stop.set()
        watcher.join()


def potato_background(*args: str, log: Path) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = open(log, "wb")
    return subprocess.Popen([POTATO, *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_interruptible)


def _interruptible() -> None:
    # As from a terminal: a suite started in the background (`cmd &`) hands its children SIGINT ignored,
    # and a CLI that inherits that cannot be stopped with Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll *condition* until it returns something truthy; fail after *timeout* saying *what*."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def wait_for_state(store: Store, run_id: int, states: tuple[str, ...], timeout: float) -> Run:
    return wait_for(lambda: (r := store.get_run(run_id)).state in states and r, timeout,
                    f"run {run_id} to reach {states}")


def wait_for_training(store: Store, run_id: int, timeout: float = 120) -> Run:
    """Wait until the worker of *run_id* has reported training progress."""
    return wait_for(
        lambda: any(e.kind == "progress" and (e.data.get("step") or 0) > 0 for e in store.events(run_id))
        and store.get_run(run_id),
        timeout, f"run {run_id} to report training progress",
    )


def process_alive(pid: int | None) -> bool:
    """True when *pid* is a live (not zombie) process."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def processes_matching(marker: str) -> list[int]:
    """Pids whose command line contains *marker*."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if marker.encode() in fh.read() and process_alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def assert_private(directory: Path) -> None:
    """*directory* and every directory under it are 0700; every file is its owner's only."""
    for path in [directory, *directory.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_dir():
            assert mode == 0o700, f"{path} is {mode:o}, not 700"
        else:
            assert not mode & 0o077, f"{path} is {mode:o}: others may read it"
