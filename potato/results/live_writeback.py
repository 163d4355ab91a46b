"""The live writeback: each item's predictions in its own record of the watched data_directory, while Potato 2.12 serves it.

Potato 2.12 reads ``pre_annotation.predictions_file`` once, at its start. What
it reads afresh on every annotate page is the item's own data, and an item
whose data holds ``pre_annotation.field`` is pre-filled from it; the one way
another process changes a running 2.12's item data is its directory watcher
(``data_directory`` with ``watch_data_directory: true``), which re-reads a
changed file and replaces its items' data within ``watch_poll_interval``. So
with ``model_training.writeback.live: true``, after the writeback file is
written (``potato.results.writeback``), each item's record in the directory is made
to hold, under ``writeback.field``, exactly what that file holds for the item
— nothing where it holds nothing — and 2.12 shows it within one poll.
(Nothing else in 2.12.1 changes a running item's data from outside: its
training API trains its own model, its writeback replays its own store at
start only.)

The rules, because these are the project's own files:

- **One field, every other byte kept.** A record's change is spliced into
  its bytes (``potato.json_records``): other keys, their order, the text,
  escapes, numbers as written (``1e5``), spacing, CRLF line ends and a byte
  order mark stay as they are. Taking a prediction away removes the field
  with the comma before it, so a record whose predictions all go is its
  original bytes again.
- **Atomic, and no way in.** A changed file is written whole under a
  temporary name 2.12 does not watch (``.<name>.live-<random>.tmp``: hidden,
  and not ``.json``), fsynced, and renamed over the file, then the directory
  is fsynced: 2.12 reads the old file or the new one. The directory is one a
  data provider can write, so the temporary is made as
  ``potato.training.atomic_files`` makes every one (exclusively, never
  through a link, under a name nobody can guess, relative to the directory's
  descriptor, its mode and owner — the old file's — set through its
  descriptor), and the rename happens only while the name still holds the
  regular file that was read. A writer killed in between leaves the old file
  and a temporary, which the next writeback removes.
- **Only the directory's own files.** A data file that is a symbolic link,
  hard-linked, read-only, or (for a server that is not root) owned by
  another account is never rewritten (``potato.items.live_items.not_rewritten``):
  its items are "not live", with the reason in the run log and in ``potato
  validate``. No temporary is ever made outside the watched directory.
- **Feeds that append.** A program that appends items to a data file (a
  feed) and this writeback take turns through an advisory lock: the
  writeback holds ``flock(LOCK_EX)`` on each file it rewrites (waiting at
  most ``LOCK_WAIT_S``, else the file is left as it was and reported), and
  on its new version until the new version is complete. The rule for a
  feed: for each batch, open the file for appending, take
  ``flock(f, LOCK_EX)``, check that the name still holds the file it opened
  (``os.fstat(f.fileno()).st_ino == os.stat(path).st_ino``; if not, close it
  and open the name again), append, close. A feed that follows it never
  loses an item. Bytes a feed appended to the old file after it was read
  (one that skipped the lock) are put back at the end of the new version,
  up to the moment the writeback lets go of the old file; a feed that keeps
  the file open for good writes into the old file after that, and those
  items are lost to it.
- **Only what changed.** A file none of whose records change is not written,
  so 2.12 does not re-read it (its re-read parses the whole file and rebuilds
  its search index: bench/live_writeback.py). A file another program changed
  while it was being rewritten is read again and rewritten (three tries).
- **Whose field.** Before the first live writeback into a directory, a record
  that already holds the field (with another value than the writeback
  file's) is the project's own and stops it
  (``potato.items.live_items.foreign_field``). The marker
  (``training/live-writeback.json``) is written before the first record
  changes and lists the records that hold what the writeback wrote, so a
  first writeback cut short is finished by the next one; a record holding
  the field that the marker does not list is reported and left as it is.
  Which records can carry predictions at all (not a CSV cell, not an item
  2.12 keeps from ``data_files``): ``potato.items.live_items``.
- **Reported, never raised.** A file that cannot be read or rewritten (not
  UTF-8, a CSV cell past the csv module's limit, a full disk) is named in
  the report and left as it was; the run does not fail for it.

The writeback file stays the truth: the same rules decide what it holds
(``potato.results.writeback``: schemas, the item of the run, the leak guard,
``include_unlabeled``, ``min_confidence``), and a live writeback that failed
half-way is finished by the next one, or by ``potato start``, which catches
the records up with the file when it starts (``catch_up``). One writer at a
time: ``potato.results.writeback.writeback_lock``.

The refusal's line (``The live writeback was refused, …``) starts otherwise
than every line of a writeback that ran (``Live writeback: …``), so a log
and a test tell them apart.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from potato.config import ProjectConfig, data_directory_files, watch_poll_interval
from potato.errors import LiveWritebackError, ProjectDataError
from potato.items.data_warnings import show_path
from potato.items.live_items import (
    Marker,
    earlier_ids,
    first_records,
    foreign_field,
    line_of,
    not_rewritten,
    owns_field,
    parse_data_file,
    read_marker,
    read_targets,
    table_ids,
    unwritable,
    write_marker,
)
from potato.json_records import EditError, set_member
from potato.results.writeback import WritebackSummary, write_back, write_report, writeback_lock
from potato.training import atomic_files
from potato.training.escaping import quote

__all__ = ["LiveReport", "catch_up", "is_live", "publish", "read_targets", "sync_items", "sync_reported"]

# A file another program changes while it is rewritten is read again this many times at most.
TRIES = 3
# A rewritten file's modification time is at least this much after the old one's: 2.12 re-reads a file whose
# size or mtime changed (its directory watcher compares mtime with >), and a same-size file rewritten within
# the file system's clock tick would otherwise look unchanged.
MTIME_STEP_NS = 10_000_000
# How long the writeback waits for a feed's lock on a data file (a feed holds it for one batch), and how often
# it asks.
LOCK_WAIT_S = 10.0
LOCK_POLL_S = 0.05
FROM_DATA_FILES = "read from data_files, where Potato 2.12 keeps them"
# What this writeback's temporaries are called (.<name>.live-<random>.tmp), so that a killed one's are removed.
TEMPORARY_TAG = "live"
LEFTOVERS = atomic_files.leftover_pattern(TEMPORARY_TAG)
REFUSED = "The live writeback was refused, and no record of {directory}/ changed: {error}"


@dataclass
class LiveReport:
    """What one live writeback did to the directory's records, and what it could not show live."""

    directory: str
    poll_s: float
    files: dict[str, int] = field(default_factory=dict)  # each file rewritten: records changed
    not_live: dict[str, int] = field(default_factory=dict)  # why: items with predictions 2.12 cannot show live
    problems: list[str] = field(default_factory=list)  # files (or records) left as they were, and why
    seconds: float = 0.0
    error: str | None = None
    # The files whose records may not hold what the writeback file holds, because they were left as they
    # were (the directory itself, for a refusal after an earlier writeback): a retract must not say all is well.
    behind: list[str] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return sum(self.files.values())

    def describe(self) -> str:
        """The run log's line (a warning when ``error`` or ``problems``)."""
        if self.error:
            return REFUSED.format(directory=self.directory, error=self.error)
        if self.files:
            listed = ", ".join(f"{name} {n}" for name, n in self.files.items())
            text = (f"Live writeback: {self.changed} record(s) in {len(self.files)} file(s) of {self.directory}/ "
                    f"changed ({listed}) in {self.seconds:.1f} s; Potato 2.12 shows them within "
                    f"{self.poll_s:g} s (watch_poll_interval)")
        elif self.behind:
            text = f"Live writeback: no file of {self.directory}/ was changed, because of problems"
        else:
            text = f"Live writeback: the records in {self.directory}/ already hold these predictions; no file changed"
        if self.not_live:
            reasons = "; ".join(f"{n} {why}" for why, n in self.not_live.items())
            text += (f". Item(s) with predictions that cannot be shown live (they show once Potato 2.12 restarts, "
                     f"through pre_annotation.predictions_file): {reasons}")
        if self.problems:
            text += ". Left as they were: " + "; ".join(self.problems)
        return text

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "changed": self.changed, "text": self.describe()}


def is_live(config: ProjectConfig) -> bool:
    """Whether the project's writeback goes into the items' own records too."""
    wb = config.model_training.writeback
    return bool(wb.live and wb.schemas and config.data_directory is not None)


def publish(config: ProjectConfig, run_id: int, run_schemas: Sequence[str], predictions: Path, bundle_dir: Path,
            *, trained_on: Mapping[str, set[str]] | None = None,
            gate: Sequence[str] = ()) -> tuple[WritebackSummary, LiveReport | None]:
    """Write run *run_id*'s predictions back (``potato.results.writeback.write_back``), then, when live, into the
    items' records; keep the run's writeback report for the Training page, with the quality gate's *gate*
    verdicts in words. Raises ``WritebackError`` as ``write_back`` does; a live writeback that fails is
    reported, never raised: the file is written."""
    with writeback_lock(config):
        summary = write_back(config, run_id, run_schemas, predictions, bundle_dir, trained_on=trained_on)
        live = sync_reported(config) if is_live(config) and summary.schemas else None
    write_report(config, run_id, {**summary.as_dict(), "run_id": run_id, "written_at": time.time(),
                                  "live": live.as_dict() if live is not None else None, "gate": list(gate)})
    return summary, live


def sync_reported(config: ProjectConfig) -> LiveReport:
    """``sync_items``, its refusal reported rather than raised (the writeback file is written either way)."""
    try:
        return sync_items(config)
    except LiveWritebackError as exc:
        shown = _shown_directory(config)
        # After an earlier writeback the records may hold what the writeback file no longer does.
        return LiveReport(shown, watch_poll_interval(config.raw), error=str(exc),
                          behind=[f"{shown}/"] if owns_field(config) else [])


def catch_up(config: ProjectConfig, log: Callable[[str], None]) -> None:
    """``potato start``: make the directory's records hold what the writeback file holds (after a writer was
    killed half-way, or with ``live`` just turned on), and say what changed."""
    if not is_live(config):
        return
    with writeback_lock(config):
        report = sync_reported(config)
    if report.error or report.problems or report.files:
        log(report.describe())


def _shown_directory(config: ProjectConfig) -> str:
    return show_path(config.data_directory, config.task_dir)


def sync_items(config: ProjectConfig) -> LiveReport:
    """Make every record of the watched data_directory hold, under ``writeback.field``, what the writeback
    file holds for its item (module docstring). Call it holding ``writeback_lock``.

    Raises ``LiveWritebackError`` (before changing anything) when a record holds the field of its own before
    the first writeback, when ``data_files`` cannot be read (which of the directory's items 2.12 keeps from
    there is then unknown), or when the directory cannot be opened.
    """
    started = time.monotonic()
    directory = config.data_directory
    report = LiveReport(_shown_directory(config), watch_poll_interval(config.raw))
    targets = read_targets(config)
    try:
        seen = earlier_ids(config)
    except ProjectDataError as exc:
        raise LiveWritebackError(f"{exc}; until data_files can be read it is not known which of the "
                                 "directory's items Potato 2.12 keeps from there") from None
    marker = read_marker(config)
    if marker is None:
        problem = foreign_field(config, targets, set(seen))
        if problem:
            raise LiveWritebackError(problem)
    try:
        dir_fd = atomic_files.open_directory(directory)
    except OSError as exc:
        raise LiveWritebackError(f"{report.directory}/ cannot be opened: {exc.strerror or exc}") from None
    try:
        atomic_files.remove_leftovers(dir_fd, LEFTOVERS)
        if marker is None:  # before the first record changes: a first writeback cut short is the next one's
            marker = Marker(config.model_training.writeback.field, set())
            write_marker(config, marker)
        before_directory = sum(1 for item_id in seen if item_id in targets)
        if before_directory:
            report.not_live[FROM_DATA_FILES] = before_directory
        for path in data_directory_files(directory):
            _sync_path(config, dir_fd, path, targets, seen, marker, report)
    finally:
        os.close(dir_fd)
    report.seconds = time.monotonic() - started
    return report


class _ChangedMeanwhile(Exception):
    """The file changed while it was being rewritten (another program wrote it)."""


class _Locked(Exception):
    """Another program held the file's lock for longer than ``LOCK_WAIT_S``."""


def _sync_path(config: ProjectConfig, dir_fd: int, path: Path, targets: Mapping[str, Any], seen: set[str],
               marker: Marker, report: LiveReport) -> None:
    """Bring one data file's records up to the writeback file, or say why it is not, or not live."""
    shown = show_path(path, config.task_dir)
    for attempt in range(TRIES):
        try:
            st = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return  # gone since the directory was listed: nothing of it to show
        why = unwritable(path, config.data_directory_encoding)  # a kind of file: counted together
        if why is None:
            why = not_rewritten(config.data_directory, path.name, st)
            why = why and f"in {shown}, {why}"  # this file: counted on its own
        if why:
            _count_not_live(config, path, why, targets, seen, report)
            return
        taken: list[str] = []
        said = len(report.problems)
        try:
            changed = _sync_file(config, dir_fd, path.name, shown, targets, seen, taken, marker, report)
        except _ChangedMeanwhile:
            seen.difference_update(taken)
            del report.problems[said:]  # the records it named are read again
            if attempt + 1 == TRIES:
                report.problems.append(f"{shown} (another program kept changing it)")
                report.behind.append(shown)
            continue
        except _Locked:
            report.problems.append(f"{shown} (another program held its lock for {LOCK_WAIT_S:g} s)")
            report.behind.append(shown)
        except ValueError as exc:  # Potato 2.12 reads none of it either
            seen.difference_update(taken)
            report.problems.append(f"{shown} ({exc})")
        except (OSError, EditError) as exc:
            seen.difference_update(taken)
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            report.problems.append(f"{shown} ({why})")
            report.behind.append(shown)
        else:
            if changed:
                report.files[shown] = changed
        return


def _count_not_live(config: ProjectConfig, path: Path, why: str, targets: Mapping[str, Any], seen: set[str],
                    report: LiveReport) -> None:
    """Count the items of a file that is not rewritten which have predictions; a file that cannot be read
    is named instead, never raised (the run's predictions are in the writeback file already)."""
    try:
        ids = table_ids(config, path)
    except ProjectDataError as exc:
        report.problems.append(str(exc))
        return
    fresh = [i for i in ids if i not in seen]
    seen.update(fresh)
    held = sum(1 for i in fresh if i in targets)
    if held:
        report.not_live[why] = report.not_live.get(why, 0) + held


def _sync_file(config: ProjectConfig, dir_fd: int, name: str, shown: str, targets: Mapping[str, Any],
               seen: set[str], taken: list[str], marker: Marker, report: LiveReport) -> int:
    """Rewrite one file so that its records hold their targets; return how many changed (0: not written)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # it became a link since it was looked at
            raise _ChangedMeanwhile() from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _ChangedMeanwhile()
        _lock(fd)
        data = _read_all(fd)
        before = os.fstat(fd)
        if before.st_size != len(data):
            raise _ChangedMeanwhile()
        encoding = config.data_directory_encoding
        field_name = config.model_training.writeback.field
        data_file = parse_data_file(Path(name), data, encoding)
        pieces: list[bytes] = []
        pos = changed = 0
        holding: set[str] = set()  # records that hold what the writeback wrote, once this file is done
        dropped: set[str] = set()  # records whose field the writeback takes away
        for record, item_id in first_records(data_file, config.id_key, seen):
            taken.append(item_id)
            want = targets.get(item_id)
            have = record.value.get(field_name, _MISSING)
            if have is not _MISSING and have != want and not marker.ours(item_id):
                report.problems.append(f"{shown} line {line_of(data_file, record)}: item {quote(item_id)} holds "
                                       f"a field {field_name!r} that the live writeback never wrote; left as it is")
                continue
            if want is not None:
                holding.add(item_id)
            if (want is None and have is _MISSING) or (want is not None and have == want):
                continue
            if want is None:
                dropped.add(item_id)
            pieces += [data[pos:record.start], set_member(data, record, field_name, want, encoding)]
            pos = record.end
            changed += 1
        fresh = holding - marker.ids if marker.ids is not None else set()
        if fresh:  # the marker lists a record before it holds the field
            marker.ids |= fresh
            write_marker(config, marker)
        if changed:
            pieces.append(data[pos:])
            _replace(dir_fd, name, b"".join(pieces), fd, before)
            if dropped and marker.ids is not None:
                marker.ids -= dropped
                write_marker(config, marker)
        return changed
    finally:
        os.close(fd)  # and its lock


_MISSING = object()


def _lock(fd: int) -> None:
    """``flock(LOCK_EX)`` on *fd*, waiting at most ``LOCK_WAIT_S`` for a feed's batch; ``_Locked`` else."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise _Locked() from None
            time.sleep(LOCK_POLL_S)


def _read_all(fd: int, start: int = 0) -> bytes:
    chunks = []
    while True:
        chunk = os.pread(fd, 1 << 20, start)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        start += len(chunk)


def _replace(dir_fd: int, name: str, data: bytes, old_fd: int, before: os.stat_result) -> None:
    """Put *data* in place of *name* (module docstring): its mode and owner kept, locked until complete, and
    what was appended to the old file since it was read put back at its end."""
    try:
        with atomic_files.Replacement(dir_fd, name, mode=stat.S_IMODE(before.st_mode),
                                      owner=(before.st_uid, before.st_gid), expect=before,
                                      prefix=atomic_files.temporary_prefix(name, TEMPORARY_TAG)) as new:
            fcntl.flock(new.fileno(), fcntl.LOCK_EX)  # a feed that opens the new file waits for the put-back
            new.write(data)
            new.commit()
            appended = _read_all(old_fd, before.st_size)
            if appended:
                new.write(appended)
                new.sync()
            after = os.fstat(new.fileno())
            if after.st_mtime_ns <= before.st_mtime_ns and after.st_size == before.st_size:
                os.utime(new.fileno(), ns=(after.st_atime_ns, before.st_mtime_ns + MTIME_STEP_NS))
    except atomic_files.ChangedMeanwhile:
        raise _ChangedMeanwhile() from None
