"""Auto-retraining: ``potato start`` queues a run as annotators' labels arrive.

Annotators label through a Potato 2.12 server, a different process that
cannot call us; what we can see is what it writes. So a watcher thread looks
at ``<output_annotation_dir>/<user>/user_state.json`` every ``POLL_SECONDS``:
it stats each file and re-counts only those whose size, mtime or inode changed
(2.12 replaces the file on every save, atomically), so an idle project costs
one ``stat`` per annotator per poll. A busy annotator's file is rewritten on
every click (100 k items: 25-30 MB): counting it reads only the members that
matter (``labels.annotated_ids``), and a file whose count costs more is
re-counted less often, so that counting one file never takes more than
``CPU_SHARE`` of a core (``bench/auto_retrain_watch.py``).

It counts annotations as 2.12's ``maybe_auto_retrain`` does (one item
annotated by one annotator is one annotation), but only on items of the
project (``ProjectItems``): an id that is no item (2.12 saves a label on any
id posted to it) counts for nothing. It queues one run with trigger ``auto`` when

1. ``auto_retrain.enabled`` is true,
2. no run is queued or running (checked again inside the store's write lock,
   so two servers never queue two runs),
3. ``min_interval_s`` have passed since the last run ended, and
4. at least ``update_frequency`` annotations were made since the count at the
   last auto run.

The count at the last auto run is the ``annotation_count`` of the newest auto
run in the run store, not a variable in this process: a restart neither loses
a trigger (annotations made while the server was down count at its next
check) nor repeats one. When the count falls below it (annotations deleted, an
annotator's directory removed), it follows the count down, so the next
``update_frequency`` annotations trigger as usual instead of first making up
for what was removed. A project that never auto-trained counts from zero, so a
server started on one with enough annotations queues a run at once.

Every check that does not queue says why in ``status()`` ("waiting for 3 more
annotations"), which the Training page shows: a debounce that stays silent
looks broken.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from potato.annotations.labels import UserStateError, annotated_ids, find_user_states
from potato.config import AutoRetrainConfig, ProjectConfig, data_directory_files
from potato.errors import ProjectDataError, RunRequestError
from potato.items.read import item_ids
from potato.runs.queue import create_run
from potato.runs.store import AUTO, Run, Store

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0
# The most of a core that counting one annotator's file may take (a busy annotator's file changes on
# every poll); bench/auto_retrain_watch.py measures it.
CPU_SHARE = 0.05
# A file counted in less CPU than this (a few thousand items) is counted again at its next change.
CHEAP_COUNT_S = 0.01


@dataclass(frozen=True)
class Decision:
    """Whether to queue an auto run now; *reason* says why not (empty when it does)."""

    queue: bool
    reason: str


def decide(settings: AutoRetrainConfig, *, annotations: int, at_last_auto_run: int, busy: bool,
           last_finished_at: float | None, now: float) -> Decision:
    """The watcher's rules, in order (module docstring); pure, so each reason is testable."""
    if not settings.enabled:
        return Decision(False, "auto-retraining is off (model_training.auto_retrain.enabled)")
    if busy:
        return Decision(False, "a run is queued or running")
    if last_finished_at is not None and now - last_finished_at < settings.min_interval_s:
        wait = settings.min_interval_s - (now - last_finished_at)
        return Decision(False, f"waiting {wait:.0f} more second(s) since the last run ended "
                               f"(min_interval_s {settings.min_interval_s:g})")
    new = annotations - at_last_auto_run
    if new < settings.update_frequency:
        return Decision(False, f"waiting for {settings.update_frequency - new} more annotation(s) "
                               f"({new} of {settings.update_frequency} since the last automatic run)")
    return Decision(True, "")


class ProjectItems:
    """The ids of the project's items, read again only when a data file changed (a ``stat`` each per poll).

    A set of 1 M ids costs about 100 MB; reading them, about a second.
    """

    def __init__(self, config: ProjectConfig):
        self.config = config
        self._signature: tuple | None = None
        self._ids: frozenset[str] | None = None

    def current(self) -> frozenset[str] | None:
        """The item ids now; None while the items cannot be read (then every annotated id counts)."""
        signature = self._sources()
        if signature != self._signature:
            try:
                self._ids = frozenset(item_ids(self.config))
            except (ProjectDataError, OSError) as exc:
                log.warning("Auto-retrain cannot read the project's items (%s); counting every annotated id", exc)
                self._ids = None
            self._signature = signature
        return self._ids

    def _sources(self) -> tuple:
        paths = list(self.config.data_files)
        if self.config.data_directory is not None:
            paths += data_directory_files(self.config.data_directory)
        found = []
        for path in paths:
            try:
                st = Path(path).stat()
            except OSError:
                continue
            found.append((str(path), st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(found)


@dataclass(frozen=True)
class _Counted:
    key: tuple[int, int, int]  # the file's mtime, size and inode when it was counted
    items: frozenset[str] | None  # the item ids it was counted against
    count: int
    due: float  # the earliest time (monotonic) a change is counted again


class AnnotationCounter:
    """All annotators' annotations on items, counted from their files: stat first, re-count what changed.

    *items* returns the project's item ids (``ProjectItems.current``); without
    it every annotated id counts. A file whose last count took c seconds of CPU
    (at least ``CHEAP_COUNT_S``) is not counted again before ``c / CPU_SHARE``
    seconds have passed: its count lags a busy annotator by a few seconds at
    most, and counting never takes more than ``CPU_SHARE`` of a core per file.
    """

    def __init__(self, annotation_dir: Path, items: Callable[[], frozenset[str] | None] | None = None, *,
                 clock: Callable[[], float] = time.monotonic, cpu: Callable[[], float] = time.thread_time):
        self.annotation_dir = annotation_dir
        self.items = items or (lambda: None)
        self.clock = clock
        self.cpu = cpu
        self._seen: dict[Path, _Counted] = {}
        self.parses = 0  # files counted so far (what "cheaply" means, for tests and benches)

    def count(self) -> int:
        items = self.items()
        total, seen = 0, {}
        for user, path in find_user_states(self.annotation_dir):
            try:
                st = path.stat()
            except OSError:
                continue
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
            previous = self._seen.get(path)
            now = self.clock()
            if previous is not None and previous.items is items and (previous.key == key or now < previous.due):
                seen[path] = previous  # unchanged, or changed again too soon: counted at its due time
            else:
                seen[path] = self._count(path, key, items, previous, now)
            total += seen[path].count
        self._seen = seen
        return total

    def _count(self, path: Path, key: tuple[int, int, int], items: frozenset[str] | None,
               previous: _Counted | None, now: float) -> _Counted:
        started = self.cpu()
        try:
            annotated = annotated_ids(path)
        except (OSError, UnicodeDecodeError, UserStateError) as exc:
            # Keep the last good count; an atomic writer leaves no half file, so this is rare.
            log.warning("Auto-retrain could not read %s (%s); counting it as before", path, exc)
            return _Counted(key, items, previous.count if previous else 0, now)
        self.parses += 1
        count = len(annotated) if items is None else len(annotated & items)
        cost = self.cpu() - started
        return _Counted(key, items, count, now + cost / CPU_SHARE if cost >= CHEAP_COUNT_S else now)


class AutoRetrainWatcher:
    """Queues auto runs for one project (``check_once``); a thread calls it every ``poll_seconds``."""

    def __init__(self, config: ProjectConfig, store: Store, *, poll_seconds: float = POLL_SECONDS,
                 clock: Callable[[], float] = time.time):
        self.config = config
        self.store = store
        self.poll_seconds = poll_seconds
        self.clock = clock
        self.counter = AnnotationCounter(config.output_annotation_dir, ProjectItems(config).current)
        self._status: dict[str, Any] = {"enabled": config.model_training.auto_retrain.enabled,
                                        "text": "not checked yet"}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check_once(self) -> Run | None:
        """Count, decide, and queue an auto run when the rules allow; return it (None otherwise)."""
        settings = self.config.model_training.auto_retrain
        annotations = self.counter.count() if settings.enabled else 0
        last_auto = self.store.latest_run(trigger=AUTO)
        at_last = (last_auto.annotation_count or 0) if last_auto else 0
        if settings.enabled and last_auto is not None and annotations < at_last:
            # Annotations went away: count the next ones from here, not from a number no longer there.
            self.store.update_run(last_auto.id, annotation_count=annotations)
            log.info("Auto-retrain: %d annotations, fewer than the %d at run %d; counting new ones from %d",
                     annotations, at_last, last_auto.id, annotations)
            at_last = annotations
        busy = self.store.next_queued() is not None or bool(self.store.active_runs())
        decision = decide(settings, annotations=annotations, at_last_auto_run=at_last, busy=busy,
                          last_finished_at=self.store.last_finished_at(), now=self.clock())
        run = None
        if decision.queue:
            try:
                run = create_run(
                    self.config, self.store, trainer=settings.trainer, schemas=list(settings.schemas),
                    backend=settings.backend, options=dict(settings.params), trigger=AUTO,
                    annotation_count=annotations, only_when_idle=True,
                )
            except RunRequestError as exc:  # refused before queueing (a trainer's missing model): say why
                decision = Decision(False, f"no run queued: {exc}")
            else:
                decision = Decision(False, f"queued run {run.id}" if run else "a run is queued or running")
        if run is not None:
            log.info("Auto-retrain: %d annotations, %d since the last automatic run; queued run %d on %s",
                     annotations, annotations - at_last, run.id, run.backend)
        self._status = {
            "enabled": settings.enabled,
            "annotations": annotations if settings.enabled else None,
            "since_last_auto_run": annotations - at_last if settings.enabled else None,
            "update_frequency": settings.update_frequency,
            "min_interval_s": settings.min_interval_s,
            "last_auto_run": run.id if run else (last_auto.id if last_auto else None),
            "checked_at": self.clock(),
            "text": decision.reason,
        }
        return run

    def status(self) -> dict[str, Any]:
        """What the last check found, for the admin API and the Training page."""
        return dict(self._status)

    def start(self) -> None:
        if not self.config.model_training.auto_retrain.enabled:
            self.check_once()  # records "off" for the page; nothing to watch
            return
        self._thread = threading.Thread(target=self._loop, name="potato-auto-retrain", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                self.check_once()
            except Exception:  # a bad moment (a busy store) must not end the watching
                log.exception("Auto-retrain check failed")
            if self._stop.wait(self.poll_seconds):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

