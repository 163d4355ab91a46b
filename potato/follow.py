"""Following a run in a terminal: a live step line, a progress bar, its warnings, its scores.

Scores are shown as stored, and a store may hold what an older server let
in (a score that is not a mapping, a null accuracy when a schema had no
holdout items): such a value shows as ``?`` or ``-`` and never stops
``potato training runs`` from listing every run.
"""

from __future__ import annotations

import time
from typing import Callable, TextIO

from potato.store import END_STATES, Run, Store
from potato.trainers import metrics

BAR_WIDTH = 24


def progress_bar(fraction: float | None) -> str:
    if fraction is None:
        return ""
    fraction = min(max(fraction, 0.0), 1.0)
    filled = int(round(fraction * BAR_WIDTH))
    return f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {fraction * 100:3.0f}%"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def run_duration(run: Run, now: float | None = None) -> float | None:
    if not run.started_at:
        return None
    return (run.finished_at or now or time.time()) - run.started_at


def _number(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _schema_scores(scores: object) -> list[tuple[str, dict | None]]:
    """(schema, its scores or None when they are not a mapping), sorted; nothing for a non-mapping."""
    if not isinstance(scores, dict):
        return []
    return [(str(k), v if isinstance(v, dict) else None) for k, v in sorted(scores.items(), key=lambda kv: str(kv[0]))]


def format_scores(scores: dict | None) -> str:
    parts = [f"{schema} ?" if s is None else _score_text(schema, s, short=True)
             for schema, s in _schema_scores(scores)]
    return "; ".join(parts) or "-"


def describe_scores(scores: dict | None) -> str:
    """Every schema's scores in full (``sentiment: accuracy 0.950, macro-F1 0.949 (n=40)``), as the Training page shows them."""
    parts = [f"{schema} ?" if s is None else _score_text(schema, s) for schema, s in _schema_scores(scores)]
    return "; ".join(parts) or "-"


def _score_text(schema: str, s: dict, *, short: bool = False) -> str:
    if "ece_before" in s:  # decision-calibrate
        kept = "kept" if s.get("kept") else "backed out"
        return f"{schema}: ECE {_number(s.get('ece_before'))} -> {_number(s.get('ece_after'))} ({kept})"
    if not metrics.has_holdout(s):
        return f"{schema}: {metrics.NO_HOLDOUT}"
    if short:
        return f"{schema} acc {_number(s.get('accuracy'))} F1 {_number(s.get('macro_f1'))}"
    return (f"{schema}: accuracy {_number(s.get('accuracy'))}, macro-F1 {_number(s.get('macro_f1'))} "
            f"(n={s.get('n', 0)})")


class Follower:
    """Prints a run's progress as it changes; on a terminal the step line updates in place."""

    def __init__(self, store: Store, run_id: int, out: TextIO, *, tty: bool):
        self.store = store
        self.run_id = run_id
        self.out = out
        self.tty = tty
        self.cursor = 0
        self.last_line = ""
        self.last_kind = ""
        self.last_printed = 0.0
        self.line_open = False

    def _emit(self, text: str) -> None:
        if self.line_open:
            self.out.write("\r\033[K")
            self.line_open = False
        self.out.write(text + "\n")
        self.out.flush()

    def _status(self, text: str) -> None:
        if self.tty:
            self.out.write("\r\033[K" + text[:200])
            self.out.flush()
            self.line_open = True
        else:
            self._emit(text)

    def update(self) -> Run:
        run = self.store.get_run(self.run_id)
        for event in self.store.events(self.run_id, after=self.cursor):
            self.cursor = event.seq
            if event.kind == "log" and event.data.get("level") in ("warning", "error"):
                self._emit(f"{event.data['level']}: {event.data.get('message', '')}")
        line = run.step or run.state
        if run.state == "queued":
            position = self.store.queue_position(run.id)
            line = f"queued (position {position} in the queue)" if position else "queued"
        bar = progress_bar(run.progress) if run.state == "running" else ""
        text = f"[run {run.id}] {line} {bar}".rstrip()
        now = time.monotonic()
        # Off a terminal (a log file, CI), print a new kind of step at once ("training",
        # "predicting", …) but its moving numbers at most every 5 s.
        kind = line.split(":", 1)[0]
        if text != self.last_line and (self.tty or kind != self.last_kind or now - self.last_printed > 5):
            self._status(text)
            self.last_line, self.last_kind, self.last_printed = text, kind, now
        return run

    def finish(self, run: Run) -> None:
        if self.line_open:
            self.out.write("\n")
            self.line_open = False
        took = format_duration(run_duration(run))
        if run.state == "succeeded":
            self._emit(f"Run {run.id} succeeded in {took} on {run.backend}")
        elif run.state == "cancelled":
            self._emit(f"Run {run.id} was cancelled")
        else:
            self._emit(f"Run {run.id} failed: {run.error}")
        shown = _schema_scores(run.scores)
        if shown:
            self._emit("Holdout scores:")
            for schema, s in shown:
                if s is None:
                    self._emit(f"  {schema}: ? (not a score: {run.scores[schema]!r})")
                else:
                    self._emit("  " + _score_text(schema, s))


def follow(store: Store, run_id: int, out: TextIO, *, tty: bool, tick: Callable[[], None] | None = None,
           interval: float = 0.25) -> Run:
    """Follow *run_id* until it ends; *tick* runs every interval (the CLI dispatches there)."""
    follower = Follower(store, run_id, out, tty=tty)
    while True:
        if tick is not None:
            tick()
        run = follower.update()
        if run.state in END_STATES:
            follower.finish(run)
            return run
        time.sleep(interval)
