"""Writing and reading ``events.jsonl`` (result files are written whole by ``potato.training.atomic_files``).

The worker appends one JSON object per line and flushes after each, so a
reader tailing the file (the local flow, the remote agent) sees every event
as soon as it is written. Readers take complete lines only: a line without
its ``\\n`` is still being written and is left for the next read.

Every event has ``seq`` (1, 2, ...), ``t`` (unix time) and ``type``; see
docs/architecture.md, "The job directory".

Events are strict JSON: a NaN or infinite number (a diverging training's
loss is the usual one) is written as null, with a warning in the log the
first time each field has one. Python's json would write ``NaN``, which the
server refuses and no browser parses.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from potato.training.escaping import open_text

EVENT_TYPES = ("started", "log", "progress", "metrics", "done")


class Cancelled(Exception):
    """Raised inside a trainer when the worker was asked to stop (SIGTERM)."""


class TrainerFailure(Exception):
    """Raised by a trainer for a failure whose message is meant for the user as is.

    The worker reports it without a traceback (e.g. a model that is not
    available offline, an item file that cannot be read).
    """


class OutOfGpuMemory(TrainerFailure):
    """A trainer's GPU ran out of memory; the message says which options to lower. The worker exits 5."""


def read_events(path: str, offset: int = 0) -> Tuple[List[Dict[str, Any]], int]:
    """Read the complete event lines of ``path`` from byte ``offset``.

    Returns the events and the offset to pass next time (just past the last
    complete line). A missing file reads as no events. A partial last line
    (no newline yet) is not returned; blank or unparsable complete lines are
    skipped.
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    events = []
    for line in data[: end + 1].splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line.decode("utf-8"))
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events, offset + end + 1


def _finite(value: Any, path: str, bad: List[Tuple[str, float]]) -> Any:
    """*value* with each NaN or infinite float replaced by None; (place, value) of each go to *bad*."""
    if isinstance(value, float) and not math.isfinite(value):
        bad.append((path, value))
        return None
    if isinstance(value, dict):
        return {k: _finite(v, "{}.{}".format(path, k), bad) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v, "{}[{}]".format(path, i), bad) for i, v in enumerate(value)]
    return value


def non_finite_warning(found: List[Tuple[str, float]]) -> str:
    """The log line written the first time a field of an event is NaN or infinite."""
    return ("{} was {}; written as null, since JSON has no NaN or Infinity. A loss that is not a number "
            "means the training diverged: try a lower learning_rate. Later such values of {} are written "
            "as null without another warning".format(
                ", ".join(p for p, _ in found), ", ".join(str(v) for _, v in found),
                ", ".join(p for p, _ in found)))


class EventWriter:
    """Appends events to ``events.jsonl``; safe to call from several threads.

    Once a ``done`` event is written the writer is closed and later events
    are dropped, so ``done`` is always last.

    The trainer sees this object as ``events``: ``log``, ``progress``,
    ``metrics``, ``check_cancelled`` and the ``cancelled`` flag.
    """

    def __init__(self, path: str, *, progress_interval: float = 0.5):
        self.path = path
        self.progress_interval = progress_interval
        self._lock = threading.Lock()
        self._seq = 0
        self._closed = False
        self._last_progress = None  # type: Optional[float]
        self._pace_start = None  # type: Optional[Tuple[Any, float, int]]  # (phase key, when, its first step)
        self._warned = set()  # type: Set[str]
        self._cancel = threading.Event()
        self._part = None  # type: Optional[Dict[str, Any]]
        self._scores_before = {}  # type: Dict[str, Any]
        # Continue numbering if the file already holds events (a re-run in the same dir).
        existing, _ = read_events(path)
        if existing:
            self._seq = max(int(e.get("seq", 0)) for e in existing)
        self._file = open_text(path, "a")

    # -- writing -----------------------------------------------------------

    def set_part(self, part: Optional[Dict[str, Any]], scores_before: Optional[Dict[str, Any]] = None) -> None:
        """While one part of a job with several trainers trains (``potato.training.parts``): its
        ``part`` fields go into each progress event, and each metrics event also carries
        *scores_before*, the schemas the parts before it scored. None ends the part."""
        self._part = part
        self._scores_before = scores_before if scores_before is not None else {}

    def emit(self, type_: str, **fields: Any) -> Optional[int]:
        """Append one event; returns its ``seq``, or None when the writer is closed."""
        if self._part is not None:
            if type_ == "progress":
                fields = dict(fields, **self._part)
            elif type_ == "metrics":
                fields = dict(fields, scores=dict(self._scores_before, **(fields.get("scores") or {})))
        with self._lock:
            if self._closed:
                return None
            found = []  # type: List[Tuple[str, float]]
            fields = {k: _finite(v, "{}.{}".format(type_, k), found) for k, v in fields.items()}
            new = [(place, value) for place, value in found if place not in self._warned]
            if new:  # before the event itself: nothing may follow ``done``
                self._warned.update(place for place, _ in new)
                self._write("log", {"level": "warning", "message": non_finite_warning(new)})
            self._write(type_, fields)
            if type_ == "done":
                self._closed = True
                try:
                    os.fsync(self._file.fileno())
                finally:
                    self._file.close()
            return self._seq

    def _write(self, type_: str, fields: Dict[str, Any]) -> None:
        self._seq += 1
        event = {"seq": self._seq, "t": round(time.time(), 3), "type": type_}
        event.update(fields)
        self._file.write(json.dumps(event, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n")
        self._file.flush()

    def log(self, message: str, level: str = "info") -> None:
        """A line for the run log; ``level`` is info, warning or error."""
        self.emit("log", level=level, message=message)

    def progress_due(self, step: int, total: int) -> bool:
        """Whether a progress event for ``step`` would be written now (the last step always is)."""
        last = self._last_progress
        return last is None or step >= total or time.monotonic() - last >= self.progress_interval

    def progress(
        self,
        phase: str,
        step: int,
        total: int,
        *,
        epoch: Optional[float] = None,
        loss: Optional[float] = None,
        force: bool = False,
        **extra: Any
    ) -> None:
        """Report progress, at most once per ``progress_interval`` unless ``force``.

        The last step (``step == total``) is always written.
        """
        if not force and not self.progress_due(step, total):
            return
        now = self._last_progress = time.monotonic()
        fields = {"phase": phase, "step": step, "total": total}  # type: Dict[str, Any]
        if epoch is not None:
            fields["epoch"] = epoch
        if loss is not None:
            fields["loss"] = round(float(loss), 5)
        eta = self._eta(phase, extra.get("schema"), step, total, now)
        if eta is not None:
            fields["eta_s"] = eta
        fields.update(extra)
        self.emit("progress", **fields)

    def _eta(self, phase: str, schema: Any, step: int, total: int, now: float) -> Optional[float]:
        """Seconds until ``step`` reaches ``total`` at the pace of this phase so far (its steps done and the
        time they took), None until a step is done. A new phase, schema or a step count going back starts
        the pace again: predicting is not as fast as training."""
        key = (phase, str(schema), str(self._part and self._part.get("part")))
        start = self._pace_start
        if start is None or start[0] != key or step < start[2]:
            self._pace_start = (key, now, step)
            return None
        done = step - start[2]
        if done <= 0 or step >= total:
            return None
        return round((total - step) * (now - start[1]) / done, 1)

    def metrics(self, scores: Dict[str, Any]) -> None:
        """Holdout scores per schema."""
        self.emit("metrics", scores=scores)

    def done(self, status: str, error: Optional[str] = None) -> None:
        """The last event: ``status`` is succeeded, failed or cancelled."""
        fields = {"status": status}  # type: Dict[str, Any]
        if error is not None:
            fields["error"] = error
        self.emit("done", **fields)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- cancellation ------------------------------------------------------

    def request_cancel(self) -> None:
        """Ask the trainer to stop at its next step (the SIGTERM handler calls this)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check_cancelled(self) -> None:
        """Raise :class:`Cancelled` when a stop was requested; trainers call it every step."""
        if self._cancel.is_set():
            raise Cancelled("Cancelled")
