"""Publishing a run end to end, the same for the run page, the admin API and the CLI.

``prepare`` does everything that can be refused before the Hub is asked —
the token is there, the run's model is here and complete, the request is
valid, no other upload of the run is under way — and claims the run's
``publication``; ``execute`` uploads, beating while it runs, and records how
it ended. The CLI calls both in its own process; ``potato start`` answers the
request after ``prepare`` and runs ``execute`` in a ``Publisher`` thread, so
no request thread waits on the Hub and the page polls the progress.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from potato.config import ProjectConfig
from potato.publish import publication, publish_errors
from potato.publish.hub import Progress, Published, hub_endpoint, hub_token, upload, without_credentials
from potato.publish.plan import PublishPlan, Request, default_message, make_plan, request_from
from potato.publish.prefect_link import link_published
from potato.runs.prefect_runs import project_key_of
from potato.runs.store import Store

log = logging.getLogger(__name__)

# Progress reaches the store at most this often (and at each change of phase).
PROGRESS_EVERY_S = 0.5


@dataclass(frozen=True)
class Prepared:
    """A publish that may start: its plan, request and endpoint; the run's publication is claimed."""

    run_id: int
    plan: PublishPlan
    request: Request
    endpoint: str
    via: str
    project_key: str  # its Prefect artifacts' key (potato.runs.prefect_runs.project_key_of)


def prepare(config: ProjectConfig, store: Store, run_id: int, request: Request, *, via: str) -> Prepared:
    """Check everything that needs no Hub and claim run *run_id*'s publication; raises ``PublishRefused``."""
    hub_token()
    plan = make_plan(config, store, run_id, request)
    endpoint = hub_endpoint()
    total = sum(f.size for f in plan.files(request.repo))
    publication.claim(store, run_id, request, endpoint=without_credentials(endpoint), via=via, total=total)
    return Prepared(run_id, plan, request, endpoint, via, project_key_of(config))


def execute(store: Store, prepared: Prepared, on_progress: Callable[[str, int, int], None] | None = None) -> Published:
    """Upload what *prepared* plans; record the outcome in the run's publication; raise ``PublishError`` on failure."""
    run = store.get_run(prepared.run_id)
    last = [0.0, ""]

    def changed(phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        if phase != last[1] or now - last[0] >= PROGRESS_EVERY_S or done >= total:
            last[:] = [now, phase]
            publication.progress(store, prepared.run_id, phase, done, total)
        if on_progress is not None:
            on_progress(phase, done, total)

    files = prepared.plan.files(prepared.request.repo)
    stop_beating = threading.Event()
    beater = threading.Thread(target=_beat, args=(store, prepared.run_id, stop_beating), daemon=True,
                              name=f"potato-publish-beat-{prepared.run_id}")
    beater.start()
    try:
        published = upload(
            files, repo=prepared.request.repo, revision=prepared.request.revision,
            private=prepared.request.private, message=prepared.request.message or default_message(run),
            description=_description(prepared.plan), run_id=run.id,
            progress=Progress(sum(f.size for f in files), changed), endpoint=prepared.endpoint)
    except publish_errors.PublishError as exc:
        publication.failed(store, prepared.run_id, str(exc))
        raise
    except KeyboardInterrupt:  # the CLI's Ctrl-C: the upload is over
        publication.interrupted(store, prepared.run_id, stale_only=False)
        raise
    except Exception as exc:  # outside the Hub client (hub.upload translates its own): no URL of the Hub in it
        log.exception("Publishing run %s failed", prepared.run_id)
        failure = publish_errors.UploadFailed(f"{type(exc).__name__}: {exc}")
        publication.failed(store, prepared.run_id, str(failure))
        raise failure from exc
    finally:
        stop_beating.set()
    publication.succeeded(store, prepared.run_id, published, prepared.via)
    link_published(run, published, prepared.project_key)
    return published


def _beat(store: Store, run_id: int, stop: threading.Event) -> None:
    while not stop.wait(publication.BEAT_S):
        try:
            publication.beat(store, run_id)
        except Exception:  # noqa: BLE001 - a missed beat only makes the upload look stale sooner
            log.exception("Could not record that run %s is still being published", run_id)


def _description(plan: PublishPlan) -> str:
    facts = plan.facts
    scores = "; ".join(f"{s.name}: accuracy {s.scores.get('accuracy')}, macro-F1 {s.scores.get('macro_f1')}"
                       for s in facts.schemas if s.scores)
    text = f"Published by Potato from run {plan.run_id}"
    if plan.model_run_id != plan.run_id:
        text += f" (the model of run {plan.model_run_id}, with its calibration)"
    return f"{text}. Holdout: {scores or 'not scored'}."


class Publisher:
    """``potato start``'s uploads: one daemon thread each, so a request never waits on the Hub."""

    def __init__(self, store: Store):
        self.store = store
        self._threads: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        """Fail the publications an earlier server left uploading (it stopped mid-upload)."""
        ended = publication.reconcile(self.store)
        if ended:
            log.info("Publishing of run(s) %s was interrupted by the last stop", ", ".join(map(str, ended)))

    def submit(self, prepared: Prepared) -> None:
        thread = threading.Thread(target=self._run, args=(prepared,), daemon=True,
                                  name=f"potato-publish-{prepared.run_id}")
        with self._lock:
            self._threads[prepared.run_id] = thread
        thread.start()

    def _run(self, prepared: Prepared) -> None:
        try:
            published = execute(self.store, prepared)
            log.info("Published run %s to %s (commit %s)", prepared.run_id, published.url, published.commit)
        except publish_errors.PublishError as exc:
            log.warning("Publishing run %s failed: %s", prepared.run_id, exc)
        finally:
            with self._lock:
                self._threads.pop(prepared.run_id, None)

    def stop(self) -> None:
        """Record every upload still running as interrupted (its thread dies with the process)."""
        with self._lock:
            running = list(self._threads)
        for run_id in running:
            try:
                publication.interrupted(self.store, run_id, stale_only=False)
            except Exception:  # noqa: BLE001 - stopping goes on
                log.exception("Could not record that publishing run %s was interrupted", run_id)


def publish_command(config: ProjectConfig, run_id: int, body: dict, *, echo: Callable[..., None]) -> int:
    """``potato training publish``: publish in this process, printing progress; the exit status (0 or 1)."""
    from potato.errors import StoreError, UnknownRun
    from potato.runs.paths import open_store

    store = open_store(config)
    shown_at = [None, -1]

    def progress(phase: str, done: int, total: int) -> None:
        step = 4 * done // total if total else 4
        if (phase, step) != tuple(shown_at):
            shown_at[:] = [phase, step]
            echo(publication.progress_text(request.repo, phase, done, total))

    try:
        request = request_from(body, default_license=config.model_training.license)
        prepared = prepare(config, store, run_id, request, via="cli")
        echo(f"Publishing run {run_id} to {request.repo} on {without_credentials(prepared.endpoint)} "
             f"({'private' if request.private else 'public'} if new, revision {request.revision})")
        published = execute(store, prepared, progress)
    except UnknownRun as exc:
        echo(str(UnknownRun(exc.run_id, config.path)), err=True)
        return 1
    except (publish_errors.PublishError, StoreError) as exc:
        echo(str(exc), err=True)
        return 1
    finally:
        store.close()
    echo(f"Published run {run_id} to {published.url} as {published.user}: commit {published.commit} "
         f"({'private' if published.private else 'public'})")
    return 0
