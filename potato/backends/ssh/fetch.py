"""Fetch artifacts: copy a run's model files back from the host, trusting none of its names.

The host lists its ``artifacts/`` with ``potato/training/list_files.py``
(NUL-terminated records; ``parse_listing`` reads them); only regular files
with plain relative names are copied, each into a file created here under
``artifacts.partial/`` (``potato.training.safe_paths``), which is renamed to
``artifacts/`` once the copy is complete. Everything else is refused and
named in the run log, and stays on the host.

Large files come as one ``cat`` each through the run's master connection,
straight into their file; the small rest as one tar stream that Python
unpacks member by member (bench/ssh_bench.py: a pipe through Python ran at
0.56× ``ssh host cat``, one tar for all files at 0.76×).
"""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from potato import training
from potato.backends.base import RunContext
from potato.backends.ssh.openssh import remote_path, with_env
from potato.errors import BackendError, ConnectionLost, DiskFull
from potato.training.safe_paths import UnsafeName, create_file, expect_files, extract_tar, name_problem

LIST_FILES_SOURCE = Path(training.__file__).with_name("list_files.py")
STEP_UPDATE_S = 0.5
# Files at least this large are copied with one `cat` each, the rest in one tar stream.
CAT_MIN_BYTES = 8 * 1024 * 1024


# Why list_files.py's kinds other than "f" (a regular file) are never copied.
REFUSED_KINDS = {
    b"l": "it is a symbolic link", b"p": "it is a FIFO", b"c": "it is a device", b"b": "it is a device",
    b"s": "it is a socket", b"u": "it has the setuid or setgid bit", b"?": "the host could not read it",
}


def parse_listing(data: bytes) -> tuple[list[tuple[int, str]], list[tuple[str, str]]]:
    """(files to copy as (size, name), entries refused as (name, why)) from list_files.py's output.

    Records end with NUL, so a name cannot split or forge one; every name
    must still pass ``safe_paths.name_problem``, and only kind ``f`` is copied.
    """
    files, refused = [], []
    *complete, rest = data.split(b"\0")
    if rest:
        refused.append((rest.decode("utf-8", "backslashreplace"), "the listing was cut short"))
    for record in complete:
        kind, _, tail = record.partition(b" ")
        size, _, raw = tail.partition(b" ")
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            refused.append((raw.decode("utf-8", "backslashreplace"), "its name is not valid UTF-8"))
            continue
        if kind != b"f":
            problem = REFUSED_KINDS.get(kind, "the listing did not say what it is")
        elif not size.isdigit():
            problem = "the listing gave no size for it"
        else:
            problem = name_problem(name)
        if problem:
            refused.append((name, problem))
        else:
            files.append((int(size), name))
    return sorted(files, key=lambda f: f[1]), refused


def list_remote_files(session: Any, directory: str) -> tuple[list[tuple[int, str]], list[tuple[str, str]]]:
    command = with_env(f"exec {remote_path(session.python)} - {shlex.quote(directory)}", session.target.env)
    done = session.connection.run(command, input=LIST_FILES_SOURCE.read_bytes(), timeout=120)
    return parse_listing(done.stdout)


def copy_artifacts(ctx: RunContext, session: Any, files: list[tuple[int, str]]) -> list[tuple[str, str]]:
    """Copy *files* of the remote artifacts into ``artifacts/``; return what was refused on the way.

    The host's ``tar`` is no more trusted than its listing: only the regular
    files asked for, at the sizes listed, are unpacked. Progress and the stall
    timer read the bytes that have landed; a host sending more than it listed
    is stopped. A partial copy never looks like a model: it is renamed from
    ``artifacts.partial/`` only when complete.
    """
    partial = ctx.run_dir / "artifacts.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True, mode=0o700)
    remote_root = session.job_dir + "/artifacts"
    large = [name for size, name in files if size >= CAT_MIN_BYTES]
    small = {name: size for size, name in files if size < CAT_MIN_BYTES}
    processes: list[subprocess.Popen] = []
    refused: list[tuple[str, str]] = []
    unpacker = None
    try:
        for name in large:
            try:
                out = create_file(str(partial), name)
            except (UnsafeName, FileExistsError) as exc:  # a listing no real directory tree gives
                refused.append((name, str(exc)))
                continue
            with out:
                processes.append(session.connection.popen(
                    f"exec cat {shlex.quote(remote_root + '/' + name)}", stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.PIPE))
        if small:
            remote = session.connection.popen(f"cd {shlex.quote(remote_root)} && exec tar cf - -T -",
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            processes.append(remote)
            unpacker = _Unpacker(remote.stdout, partial, small)
            # "./": a name starting with "-" must not read as one of tar's options.
            remote.stdin.write("".join(f"./{name}\n" for name in small).encode())
            remote.stdin.close()
        copied = _watch_copy(ctx, session, processes, unpacker, partial, sum(size for size, _ in files))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        if unpacker is not None:
            unpacker.join(timeout=10)
    shutil.rmtree(ctx.artifacts_dir, ignore_errors=True)
    partial.rename(ctx.artifacts_dir)
    count = sum(len(names) for _, _, names in os.walk(ctx.artifacts_dir))
    ctx.log.info(f"Copied {count} artifact files ({copied / 1e6:.1f} MB) from {session.host}")
    return refused + (unpacker.refused if unpacker else [])


class _Unpacker(threading.Thread):
    """Unpacks the host's tar stream into ``artifacts.partial/``, taking only the files asked for."""

    def __init__(self, stream, partial: Path, sizes: dict[str, int]):
        super().__init__(name="potato-unpack", daemon=True)
        self.stream, self.partial, self.sizes = stream, partial, sizes
        self.refused: list[tuple[str, str]] = []
        self.error: str | None = None
        self.disk_full = False
        self.start()

    def run(self) -> None:
        try:
            with tarfile.open(fileobj=self.stream, mode="r|") as tar:
                extract_tar(tar, str(self.partial), accept=expect_files(self.sizes),
                            refuse=lambda name, why: self.refused.append((name, why)))
        except (tarfile.TarError, OSError, UnsafeName) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self.disk_full = isinstance(exc, OSError) and exc.errno == errno.ENOSPC
        finally:
            self.stream.close()


def _watch_copy(ctx: RunContext, session: Any, processes: list[subprocess.Popen],
                unpacker: _Unpacker | None, partial: Path, total: int) -> int:
    """Wait for the copy, showing progress; raise when nothing lands for the stall time or too much does.

    The flow beats the run's heartbeat while it watches: a live flow copying
    is not an orphaned run (``potato.runs.reconcile``).
    """
    stall = float(ctx.backend.get("copy_stall_timeout_s", 180))
    what = f"copying the model from {session.host}"
    copied, last_growth = 0, time.monotonic()
    while True:
        if unpacker is not None and unpacker.error:  # the remote tar would block on a pipe nobody reads
            break
        running = [p for p in processes if p.poll() is None]
        if running:
            try:
                running[0].wait(timeout=STEP_UPDATE_S)  # returns the moment it ends
            except subprocess.TimeoutExpired:
                pass
        elif unpacker is not None and unpacker.is_alive():
            unpacker.join(timeout=STEP_UPDATE_S)
        else:
            break
        ctx.store.heartbeat(ctx.run_id)
        landed, now = _bytes_under(partial), time.monotonic()
        if landed > total:
            raise BackendError(f"The copy from {session.host} sent more than the {total} bytes its listing "
                               f"announced; the copy was stopped")
        if landed > copied:
            copied, last_growth = landed, now
            ctx.store.update_run(ctx.run_id, step=f"{what}: {_mb(copied)} of {_mb(total)} MB",
                                 progress=min(copied / total, 1.0) if total else None)
        elif now - last_growth > stall:
            raise BackendError(
                f"The copy from {session.host} sent nothing for {stall:g} s (the run's predictions are "
                f"saved; only model files are missing from artifacts/)")
    if unpacker is not None and unpacker.disk_full:
        raise DiskFull(ctx.run_dir)
    lost = session.connection.lost()
    if lost is not None:
        raise ConnectionLost(session.host, lost, copying=True)
    for process in processes:
        if process.returncode not in (0, None):
            error = process.stderr.read().decode(errors="replace").strip().splitlines() if process.stderr else []
            if any("No space left on device" in line for line in error):  # ssh writing a large file here
                raise DiskFull(ctx.run_dir)
            raise BackendError(f"The copy from {session.host} failed: {error[-1] if error else 'exit status %d' % process.returncode}")
    if unpacker is not None and unpacker.error:
        raise BackendError(f"The copy from {session.host} failed: its tar stream could not be read ({unpacker.error})")
    copied = _bytes_under(partial)
    ctx.set_step(f"{what}: {_mb(copied)} of {_mb(total)} MB", progress=1.0)
    return copied


def _mb(size: int) -> str:
    """Megabytes for the step row: whole numbers, but a small model is not "0 of 0 MB"."""
    return f"{size / 1e6:.0f}" if size >= 10e6 else f"{size / 1e6:.1f}"


def _bytes_under(directory: Path) -> int:
    total = 0
    for root, _, names in os.walk(directory):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total
