"""Following a run in a terminal: a live step line, a progress bar, its warnings, its scores.

Scores are shown as stored, and a store may hold what an older server let
in (a score that is not a mapping, a null accuracy when a schema had no
holdout items): such a value shows as ``?`` or ``-`` and never stops
``potato training runs`` from listing every run.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO

from potato.runs.store import END_STATES, Run, Store
from potato.text.score_text import number_text, score_line
from potato.training.trainers import metrics

BAR_WIDTH = 24
# A step without a progress bar (the flow starting, the bundle, a copy) shows how long it has taken
# once it has taken this long, so that a slow one is seen to be alive.
SAY_ELAPSED_AFTER_S = 2.0
# How often a wait with nothing else to show (the Prefect API starting) says it is still waiting.
STILL_WAITING_EVERY_S = 15.0


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


def format_time(stamp: float | None) -> str:
    """``2025-03-01 14:02:11 UTC+01:00``: local time with its offset from UTC (``UTC`` when there is none),
    as the pages show it, so a time read on the server and one read in a browser elsewhere can be compared."""
    if not stamp:
        return "-"
    local = time.localtime(stamp)
    return time.strftime("%Y-%m-%d %H:%M:%S ", local) + utc_offset(local.tm_gmtoff)


def utc_offset(seconds: int) -> str:
    if not seconds:
        return "UTC"
    sign, seconds = ("+" if seconds > 0 else "-"), abs(seconds)
    return f"UTC{sign}{seconds // 3600:02d}:{seconds % 3600 // 60:02d}"


def run_duration(run: Run, now: float | None = None) -> float | None:
    if not run.started_at:
        return None
    return (run.finished_at or now or time.time()) - run.started_at


def _schema_scores(scores: object) -> list[tuple[str, dict | None]]:
    """(schema, its scores or None when they are not a mapping), sorted; nothing for a non-mapping."""
    if not isinstance(scores, dict):
        return []
    return [(str(k), v if isinstance(v, dict) else None) for k, v in sorted(scores.items(), key=lambda kv: str(kv[0]))]


def format_scores(scores: dict | None) -> str:
    """The runs list's cell: a label schema's accuracy and F1 in short, any other kind's line (``score_line``)."""
    parts = [f"{schema} ?" if s is None else _short_score(schema, s) for schema, s in _schema_scores(scores)]
    return "; ".join(parts) or "-"


def _short_score(schema: str, s: dict) -> str:
    if s.get("kind", "nominal") != "nominal" or "ece_before" in s or not metrics.has_holdout(s):
        return score_line(schema, s)
    return f"{schema} acc {number_text(s.get('accuracy'))} F1 {number_text(s.get('macro_f1'))}"


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
        self.step_text, self.step_since = "", time.monotonic()

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
            elif event.kind == "cancel":
                self._emit(f"Cancel requested {event.data.get('by', '')}")
        line = run.step or run.state
        if run.state == "queued":
            position = self.store.queue_position(run.id)
            line = f"queued (position {position} in the queue)" if position else "queued"
        now = time.monotonic()
        # Off a terminal (a log file, CI), print a new kind of step at once ("training",
        # "predicting", …) but its moving numbers at most every 5 s.
        kind = line.split(":", 1)[0]
        if line != self.step_text:
            self.step_text, self.step_since = line, now
        bar = progress_bar(run.progress) if run.state == "running" else ""
        if not bar and now - self.step_since >= SAY_ELAPSED_AFTER_S:
            line += f" ({format_duration(now - self.step_since)})"  # a step without a bar still moves
        text = f"[run {run.id}] {line} {bar}".rstrip()
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
                    self._emit("  " + score_line(schema, s))


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


def prefect_starting() -> str:
    """Said before the run's Prefect API is started (or found): starting one takes seconds to a minute."""
    if os.environ.get("PREFECT_API_URL"):
        return f"Connecting to the Prefect API at {os.environ['PREFECT_API_URL']} (PREFECT_API_URL)…"
    return "Starting Prefect, which runs each run as a flow (the project's own API, reused once it runs)…"


def prefect_ready(api: str, seconds: float) -> str:
    return f"Prefect API ready at {api} after {format_duration(seconds)}"


@contextmanager
def still_waiting(out: TextIO, what: str, every: float | None = None) -> Iterator[None]:
    """While the block runs, say every *every* seconds (``STILL_WAITING_EVERY_S``) that *what* is still
    going on, and for how long: a wait that says nothing for a minute reads as a hang."""
    every = every or STILL_WAITING_EVERY_S
    done, started = threading.Event(), time.monotonic()

    def tick() -> None:
        while not done.wait(every):
            out.write(f"  … {what} ({format_duration(time.monotonic() - started)})\n")
            out.flush()

    ticker = threading.Thread(target=tick, name="potato-still-waiting", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


def next_steps(config: str, run_id: int) -> list[str]:
    """What to do after a run: where its page is (``potato start`` serves it) and how to list the runs."""
    config = shlex.quote(config)
    return [
        f"Next: potato training runs {config}   (every run, its state and scores)",
        f"      potato start {config}   then open http://127.0.0.1:8000/admin/training/runs/{run_id} "
        "(log in with the config's admin_api_key)",
    ]
