"""The live writeback: each item's predictions in its own record of the watched data_directory, while Potato 2.12 serves it.

Potato 2.12 reads ``pre_annotation.predictions_file`` once, at its start. What
it reads afresh on every annotate page is the item's own data, and an item
whose data holds ``pre_annotation.field`` is pre-filled from it; the one way
another process changes a running 2.12's item data is its directory watcher
(``data_directory`` with ``watch_data_directory: true``), which re-reads a
changed file and replaces its items' data within ``watch_poll_interval``. So
with ``model_training.writeback.live: true``, after the writeback file is
written (``potato.writeback``), each item's record in the directory is made
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
- **Atomic.** A changed file is written whole under a temporary name 2.12 does
  not watch (``.<name>.live-<pid>.tmp``: hidden, and not ``.json``), fsynced,
  and renamed over the file, then the directory is fsynced: 2.12 reads the old
  file or the new one. A writer killed in between leaves the old file and a
  temporary, which the next writeback removes.
- **Only what changed.** A file none of whose records change is not written,
  so 2.12 does not re-read it (its re-read parses the whole file and rebuilds
  its search index: bench/live_writeback.py). A file another program changed
  while it was being rewritten is read again and rewritten (three tries).
- **Whose field.** Before the first live writeback into a directory, a record
  that already holds the field is the project's own and stops it
  (``potato.live_items.foreign_field``); afterwards the field is this
  writeback's. Which records can carry predictions at all (not a CSV cell,
  not an item 2.12 keeps from ``data_files``): ``potato.live_items``.

The writeback file stays the truth: the same rules decide what it holds
(``potato.writeback``: schemas, the item of the run, the leak guard,
``include_unlabeled``, ``min_confidence``), and a live writeback that failed
half-way is finished by the next one, or by ``potato start``, which catches
the records up with the file when it starts (``catch_up``). One writer at a
time: ``potato.writeback.writeback_lock``.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import orjson

from potato.config import ProjectConfig, data_directory_files, watch_poll_interval
from potato.data_warnings import show_path
from potato.errors import LiveWritebackError
from potato.json_records import EditError, set_member
from potato.live_items import (
    earlier_ids, first_records, foreign_field, marker_path, owns_field, read_data_file, table_ids, unwritable,
)
from potato.writeback import WritebackSummary, write_back, write_report, writeback_lock, writeback_path

# A file another program changes while it is rewritten is read again this many times at most.
TRIES = 3
# A rewritten file's modification time is at least this much after the old one's: 2.12 re-reads a file whose
# size or mtime changed (its directory watcher compares mtime with >), and a same-size file rewritten within
# the file system's clock tick would otherwise look unchanged.
MTIME_STEP_NS = 10_000_000
FROM_DATA_FILES = "read from data_files, where Potato 2.12 keeps them"


@dataclass
class LiveReport:
    """What one live writeback did to the directory's records, and what it could not show live."""

    directory: str
    poll_s: float
    files: dict[str, int] = field(default_factory=dict)  # each file rewritten: records changed
    not_live: dict[str, int] = field(default_factory=dict)  # why: items with predictions 2.12 cannot show live
    problems: list[str] = field(default_factory=list)  # files left as they were, and why
    seconds: float = 0.0
    error: str | None = None

    @property
    def changed(self) -> int:
        return sum(self.files.values())

    def describe(self) -> str:
        """The run log's line (a warning when ``error`` or ``problems``)."""
        if self.error:
            return f"Live writeback: no record of {self.directory}/ was changed: {self.error}"
        if self.files:
            listed = ", ".join(f"{name} {n}" for name, n in self.files.items())
            text = (f"Live writeback: {self.changed} record(s) in {len(self.files)} file(s) of {self.directory}/ "
                    f"changed ({listed}) in {self.seconds:.1f} s; Potato 2.12 shows them within "
                    f"{self.poll_s:g} s (watch_poll_interval)")
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
            *, trained_on: Mapping[str, set[str]] | None = None) -> tuple[WritebackSummary, LiveReport | None]:
    """Write run *run_id*'s predictions back (``potato.writeback.write_back``), then, when live, into the
    items' records; keep the run's writeback report for the Training page. Raises ``WritebackError`` as
    ``write_back`` does; a live writeback that fails is reported, never raised: the file is written."""
    with writeback_lock(config):
        summary = write_back(config, run_id, run_schemas, predictions, bundle_dir, trained_on=trained_on)
        live = sync_reported(config) if is_live(config) and summary.schemas else None
    write_report(config, run_id, {**summary.as_dict(), "run_id": run_id, "written_at": time.time(),
                                  "live": live.as_dict() if live is not None else None})
    return summary, live


def sync_reported(config: ProjectConfig) -> LiveReport:
    """``sync_items``, its refusal reported rather than raised (the writeback file is written either way)."""
    try:
        return sync_items(config)
    except LiveWritebackError as exc:
        return LiveReport(_shown_directory(config), watch_poll_interval(config.raw), error=str(exc))


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


def read_targets(config: ProjectConfig) -> dict[str, Any]:
    """What the writeback file holds for each item: its id, the value of its ``writeback.field``."""
    field_name = config.model_training.writeback.field
    targets: dict[str, Any] = {}
    try:
        handle = open(writeback_path(config), "rb")
    except FileNotFoundError:
        return targets
    with handle:
        for raw in handle:
            if not raw.strip():
                continue
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                record = json.loads(raw.decode("utf-8"))
            if isinstance(record, dict) and isinstance(record.get("id"), str) and field_name in record:
                targets[record["id"]] = record[field_name]
    return targets


def sync_items(config: ProjectConfig) -> LiveReport:
    """Make every record of the watched data_directory hold, under ``writeback.field``, what the writeback
    file holds for its item (module docstring). Call it holding ``writeback_lock``.

    Raises ``LiveWritebackError`` (before changing anything) when a record holds the field of its own.
    """
    started = time.monotonic()
    directory = config.data_directory
    encoding = config.data_directory_encoding
    report = LiveReport(_shown_directory(config), watch_poll_interval(config.raw))
    problem = foreign_field(config)
    if problem:
        raise LiveWritebackError(problem)
    targets = read_targets(config)
    _remove_temporaries(directory)
    seen = earlier_ids(config)
    before_directory = sum(1 for item_id in seen if item_id in targets)
    if before_directory:
        report.not_live[FROM_DATA_FILES] = before_directory
    for path in data_directory_files(directory):
        shown = show_path(path, config.task_dir)
        why = unwritable(path, encoding)
        if why:
            fresh = [i for i in table_ids(config, path) if i not in seen]
            seen.update(fresh)
            held = sum(1 for i in fresh if i in targets)
            if held:
                report.not_live[why] = report.not_live.get(why, 0) + held
            continue
        for attempt in range(TRIES):
            taken: list[str] = []
            try:
                changed = _sync_file(config, path, targets, seen, taken)
            except _ChangedMeanwhile:
                seen.difference_update(taken)
                if attempt + 1 == TRIES:
                    report.problems.append(f"{shown} (another program kept changing it)")
                continue
            except (OSError, ValueError, EditError) as exc:
                seen.difference_update(taken)
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                report.problems.append(f"{shown} ({why})")
            else:
                if changed:
                    report.files[shown] = changed
            break
    if not owns_field(config):
        marker = marker_path(config)
        marker.write_text(json.dumps({"field": config.model_training.writeback.field}) + "\n", encoding="utf-8")
    report.seconds = time.monotonic() - started
    return report


class _ChangedMeanwhile(Exception):
    """The file changed while it was being rewritten (another program wrote it)."""


def _sync_file(config: ProjectConfig, path: Path, targets: Mapping[str, Any], seen: set[str],
               taken: list[str]) -> int:
    """Rewrite one file so that its records hold their targets; return how many changed (0: not written)."""
    real = path.resolve()  # a symlink stays one: its file is rewritten where it is
    before = os.stat(real)
    encoding = config.data_directory_encoding
    field_name = config.model_training.writeback.field
    data_file = read_data_file(real, encoding)
    data = data_file.data
    pieces: list[bytes] = []
    pos = changed = 0
    for record, item_id in first_records(data_file, config.id_key, seen):
        taken.append(item_id)
        want = targets.get(item_id)
        have = record.value.get(field_name, _MISSING)
        if (want is None and have is _MISSING) or (want is not None and have == want):
            continue
        pieces += [data[pos:record.start], set_member(data, record, field_name, want, encoding)]
        pos = record.end
        changed += 1
    if changed:
        pieces.append(data[pos:])
        _replace(real, b"".join(pieces), before)
    return changed


_MISSING = object()


def _replace(path: Path, data: bytes, before: os.stat_result) -> None:
    """Put *data* in place of *path* atomically (module docstring), keeping its mode and owner."""
    tmp = path.with_name(f".{path.name}.live-{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, stat.S_IMODE(before.st_mode))
        try:
            os.chown(tmp, before.st_uid, before.st_gid)
        except PermissionError:
            pass  # another account's file: it stays readable by its mode
        now = os.stat(path)
        if (now.st_ino, now.st_size, now.st_mtime_ns) != (before.st_ino, before.st_size, before.st_mtime_ns):
            raise _ChangedMeanwhile()
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_directory(path.parent)
    after = os.stat(path)
    if after.st_mtime_ns <= before.st_mtime_ns and after.st_size == before.st_size:
        os.utime(path, ns=(after.st_atime_ns, before.st_mtime_ns + MTIME_STEP_NS))


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_temporaries(directory: Path) -> None:
    """The temporaries a writer killed half-way left (only one writer holds the lock at a time)."""
    for leftover in directory.glob(".*.live-*.tmp"):
        try:
            leftover.unlink()
        except OSError:
            pass
