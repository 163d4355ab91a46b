"""A run's ``publication`` in the store: who publishes it where, how far the upload is, how it ended.

One JSON value per run (``Store.change_json`` reads and writes it in one
transaction)::

    {"state": "uploading" | "published" | "failed",
     "repo", "revision", "private", "endpoint", "via" ("page", "api", "cli"),
     "phase" ("waiting", "checking", "uploading"), "bytes", "total",
     "started_at", "finished_at", "beat", "pid",
     "commit", "commit_url", "url", "by" (the Hub user), "error",
     "published": [{"repo", "revision", "commit", "url", "by", "via", "at"}, …]}

The top level is the latest publish; ``published`` keeps every one that
succeeded (newest last), so a failed retry never hides where the model is.
No token is ever part of it. An upload beats every ``BEAT_S`` while it runs:
one whose process is gone, or that has not beaten for ``STALE_S``, is over —
a new publish may start, and the page shows it as interrupted.
"""

from __future__ import annotations

import os
import time
from typing import Any

from potato.publish import publish_errors
from potato.publish.hub import Published
from potato.publish.plan import Request
from potato.runs.store import Store

UPLOADING, PUBLISHED, FAILED = "uploading", "published", "failed"
BEAT_S = 5.0
STALE_S = 60.0
HISTORY = 50
INTERRUPTED = ("The upload stopped when the process publishing it ended (the server stopped, or the command "
               "was interrupted). Publish again: what already reached the Hub is not sent twice")


PHASES = {"waiting": "Starting the upload to {repo}", "checking": "Checking the files for {repo}: {done} of {total}",
          "uploading": "Uploading to {repo}: {done} of {total}"}


def size_text(size: int) -> str:
    """``512 B``, ``120.1 kB``, ``3.4 MB``, ``1.2 GB`` (decimal units, as the Hub shows sizes)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def progress_text(repo: str, phase: str | None, done: int, total: int) -> str:
    """How far an upload is, for the page (``view``'s ``text``) and the CLI."""
    return PHASES.get(phase or "uploading", PHASES["uploading"]).format(
        repo=repo, done=size_text(done), total=size_text(total))


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(publication: dict[str, Any], now: float | None = None) -> bool:
    """Whether an ``uploading`` publication is over: its process is gone or it stopped beating."""
    if publication.get("state") != UPLOADING:
        return False
    beat = publication.get("beat") or 0
    return not _alive(publication.get("pid")) or (now or time.time()) - beat > STALE_S


def claim(store: Store, run_id: int, request: Request, *, endpoint: str, via: str, total: int) -> dict[str, Any]:
    """Mark run *run_id* as being published as *request* asks; ``PublishInProgress`` while another upload runs."""
    def change(current: dict[str, Any]) -> dict[str, Any]:
        if current.get("state") == UPLOADING and not is_stale(current):
            raise publish_errors.PublishInProgress(run_id, current.get("repo", "?"))
        now = time.time()
        return {"state": UPLOADING, "repo": request.repo, "revision": request.revision, "private": request.private,
                "endpoint": endpoint, "via": via, "phase": "waiting", "bytes": 0, "total": total,
                "started_at": now, "beat": now, "pid": os.getpid(), "published": current.get("published", [])}

    return store.change_json(run_id, "publication", change).publication


def _while_ours(store: Store, run_id: int, **fields: Any) -> None:
    def change(current: dict[str, Any]) -> dict[str, Any] | None:
        if current.get("state") != UPLOADING or current.get("pid") != os.getpid():
            return None
        return {**current, **fields, "beat": time.time()}

    store.change_json(run_id, "publication", change)


def progress(store: Store, run_id: int, phase: str, done: int, total: int) -> None:
    _while_ours(store, run_id, phase=phase, bytes=done, total=total)


def beat(store: Store, run_id: int) -> None:
    _while_ours(store, run_id)


def succeeded(store: Store, run_id: int, published: Published, via: str) -> dict[str, Any]:
    def change(current: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        entry = {"repo": published.repo, "revision": published.revision, "commit": published.commit,
                 "url": published.url, "by": published.user, "via": via, "at": now}
        return {**current, "state": PUBLISHED, "phase": None, "bytes": current.get("total"), "finished_at": now,
                "commit": published.commit, "commit_url": published.commit_url, "url": published.url,
                "by": published.user, "private": published.private, "error": None,
                "published": (current.get("published", []) + [entry])[-HISTORY:]}

    return store.change_json(run_id, "publication", change).publication


def failed(store: Store, run_id: int, message: str) -> dict[str, Any]:
    def change(current: dict[str, Any]) -> dict[str, Any]:
        return {**current, "state": FAILED, "phase": None, "finished_at": time.time(), "error": message}

    return store.change_json(run_id, "publication", change).publication


def interrupted(store: Store, run_id: int, *, stale_only: bool = True) -> bool:
    """Fail run *run_id*'s upload as interrupted: if it is over (*stale_only*), or whenever it is still uploading."""
    def change(current: dict[str, Any]) -> dict[str, Any] | None:
        over = is_stale(current) if stale_only else current.get("state") == UPLOADING
        return {**current, "state": FAILED, "phase": None, "finished_at": time.time(), "error": INTERRUPTED} \
            if over else None

    return store.change_json(run_id, "publication", change).publication.get("error") == INTERRUPTED


def reconcile(store: Store) -> list[int]:
    """Fail the publications whose upload is over without an outcome (the process died); return their runs."""
    return [run.id for run in store.list_runs() if is_stale(run.publication) and interrupted(store, run.id)]


def view(publication: dict[str, Any]) -> dict[str, Any] | None:
    """The publication as the page and the API show it (no pid or beat; an interrupted upload as failed;
    ``text`` says how far an upload is, ``latest`` is the newest publish that succeeded)."""
    if not publication:
        return None
    shown = {k: v for k, v in publication.items() if k not in ("pid", "beat")}
    if is_stale(publication):
        shown.update(state=FAILED, phase=None, error=INTERRUPTED)
    if shown.get("state") == UPLOADING:
        shown["text"] = progress_text(shown.get("repo", ""), shown.get("phase"), shown.get("bytes") or 0,
                                      shown.get("total") or 0)
    last = (publication.get("published") or [None])[-1]
    shown["latest"] = last
    return shown
