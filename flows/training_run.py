"""THE flow: one training run, as its steps (docs/architecture.md, "One run, end to end").

    build bundle → connect → pick GPU → sync code → spawn → relay events
    → (record results, write back) → (report to trackers) → fetch artifacts → clean up

Each step is a Prefect task named for what it does on this run, so the Prefect
UI traces a run the way its log reads. Step bodies live in the run's backend
type's steps module (``potato.backends.base.Steps``) and in ``potato.results.record_results``,
and test without Prefect; the tasks here only call them. Nothing here names a
backend type or a trainer: what differs comes from their declarations. Clean-up
runs in ``finally:``, so failures, timeouts and cancels run it too.

Started by the dispatcher as ``python -m flows.training_run --config C --run-id N``
(the flow then owns its process's main thread, so Prefect's timeout interrupts
blocking calls; its flow run belongs to the deployment
``training-run/potato-dispatcher`` so that the Prefect UI can cancel it), by a
Prefect work pool through the deployment ``training-run/potato``, or by
``prefect deployment run`` or a schedule with ``config`` (and ``backend``)
parameters, in which case the flow creates the run record itself.

The Prefect side of a run (``potato.runs.prefect_runs``): the flow holds its
project's concurrency limit, tags its flow run, and turns a cancel in Prefect
into the store's cancel request, which it then carries out as Cancel run does.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import stat
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from typing import Any, Iterator

from prefect import flow, task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency
from prefect.exceptions import TerminationSignal
from prefect.flow_engine import run_flow
from prefect.states import Cancelled

from potato.backends.base import RunContext, Steps, steps_of
from potato.backends.relay import check_limits, describe_worker_failure, watch
from potato.backends.ssh.openssh import is_transient
from potato.bundle.build import build_bundle, describe_bundle
from potato.bundle.pack import read_manifest
from potato.config import ProjectConfig, load_config
from potato.errors import DiskFull, PotatoError, RunCancelled, RunError, WallTimeExceeded
from potato.publish.facts import record_training_data
from potato.results import quality_gate, run_report
from potato.results.evaluation import read_evaluation
from potato.results.record_results import record_results
from potato.results.retention import prune_run_dirs
from potato.results.writeback import read_report
from potato.runs import prefect_runs
from potato.runs.ending import after_flow, end_run
from potato.runs.jobs import make_job
from potato.runs.paths import open_store, private_dir, run_page, run_paths
from potato.runs.prefect_api import ensure_concurrency_limit
from potato.runs.prefect_runs import CancelWatch
from potato.runs.queue import create_run
from potato.runs.runlog import RunLog
from potato.runs.store import MANUAL, SCHEDULE, Store
from potato.text.score_text import curve_lines, curve_rows, table_rows
from potato.trackers import import_clients_early, report_to_trackers
from potato.trainer_choice import describe_plan
from potato.training.escaping import escaped
from potato.training.trainers.registry import hooks

# The slot's lease is renewed while the flow lives; a flow killed with -9 frees
# it once the lease expires (measured).
LEASE_SECONDS = 60
# True in a process that main() started, i.e. the dispatcher's child.
_DISPATCHED = False
# Added to max_wall_seconds for Prefect's own flow timeout: the relay step's
# one-second check stops the run first; Prefect's timeout is the backstop.
FLOW_TIMEOUT_MARGIN_S = 60
# How long a flow whose run must wait for another run lets the project's Prefect slot go.
TURN_RETRY_S = 2.0


def _task(name: str):
    # Steps are never cached (a repeated poll must not return its first answer)
    # and not retried: a retried spawn would be a second worker.
    return task(name=name, cache_policy=NO_CACHE, persist_result=False)


@_task("build-bundle")
def build_bundle_task(ctx: RunContext) -> dict:
    ctx.set_step("building the run bundle")
    info = build_bundle(ctx.config, list(ctx.run.schemas), ctx.bundle_dir)
    for warning in info.warnings:
        ctx.log.warning(warning)
    ctx.log.info(describe_bundle(info))
    # The model card's counts (the bundle itself is deleted at clean-up).
    record_training_data(ctx.run_dir, read_manifest(ctx.bundle_dir), len(info.users),
                         make_job(ctx.config, ctx.run, bundle="")["options"])
    for prepare in hooks(ctx.run.trainers, "prepare"):
        prepare(ctx)
    return {"items": info.items, "labeled": info.labeled, "holdout": info.holdout}


def _retry_transient_ssh(task, task_run, state) -> bool:
    try:
        state.result()
    except Exception as exc:
        return is_transient(exc)
    return False


# Connecting is the one step retried: it is idempotent, and only a flaky network is retried.
CONNECT_RETRY_DELAYS_S = [5, 15]


@task(name="connect", cache_policy=NO_CACHE, persist_result=False, retries=len(CONNECT_RETRY_DELAYS_S),
      retry_delay_seconds=CONNECT_RETRY_DELAYS_S, retry_condition_fn=_retry_transient_ssh)
def connect_task(ctx: RunContext, backend) -> Any:
    from prefect.runtime import task_run

    attempts = len(CONNECT_RETRY_DELAYS_S) + 1
    attempt = max(1, task_run.run_count or 1)
    # Seen in the step row ("connecting to gpu.example.org (attempt 2 of 3)"), so a host that hangs is not
    # mistaken for a run that hangs.
    ctx.attempt = f" (attempt {attempt} of {attempts})" if attempt > 1 else ""
    try:
        return backend.connect(ctx)
    except Exception as exc:
        if attempt < attempts and is_transient(exc):
            delay = CONNECT_RETRY_DELAYS_S[attempt - 1]
            ctx.log.warning(f"{exc}; connecting again in {delay:g} s (attempt {attempt + 1} of {attempts})")
            ctx.set_step(f"waiting {delay:g} s to connect again (attempt {attempt + 1} of {attempts})")
        raise


@_task("pick-gpu")
def pick_gpu_task(ctx: RunContext, backend, session) -> str:
    return backend.pick_gpu(ctx, session)


@_task("sync-code")
def sync_code_task(ctx: RunContext, backend, session) -> str:
    return backend.sync_code(ctx, session)


@_task("spawn")
def spawn_task(ctx: RunContext, backend, session) -> Any:
    return backend.spawn(ctx, session)


@_task("relay-events")
def relay_events_task(ctx: RunContext, backend: Steps, session, handle) -> int:
    ctx.on_progress = _ProgressArtifact(ctx).update
    return watch(ctx, session, handle, backend)


@_task("record-results")
def record_results_task(ctx: RunContext) -> dict:
    scores = record_results(ctx)
    if scores:
        create_table_artifact(
            table_rows(scores),
            key=f"run-{ctx.run_id}-scores",
            description=f"Holdout scores of run {ctx.run_id}",
        )
    curve = curve_rows(scores)
    if curve:
        create_table_artifact(curve, key=f"run-{ctx.run_id}-learning-curve",
                              description=f"Learning curve of run {ctx.run_id}: " + "; ".join(curve_lines(scores)))
    _project_artifacts(ctx, scores)
    return scores


def _project_artifacts(ctx: RunContext, scores: dict) -> None:
    """The run's report, per-label table and page link under the project's keys (potato.results.run_report)."""
    project = prefect_runs.project_key_of(ctx.config)
    evaluation = read_evaluation(ctx.run_dir)
    page = run_page(ctx.config, ctx.run_id)
    name = escaped(ctx.config.annotation_task_name or project)
    create_markdown_artifact(
        run_report.report_markdown(ctx.run_id, name, scores, evaluation, quality_gate.read(ctx.paths),
                                   read_report(ctx.config, ctx.run_id), page),
        key=run_report.artifact_key(project, run_report.REPORT), description=f"Run {ctx.run_id} of {name}")
    rows = run_report.label_rows(evaluation)
    if rows:
        create_table_artifact(rows, key=run_report.artifact_key(project, run_report.LABEL_SCORES),
                              description=f"Holdout scores per label of run {ctx.run_id}")
    if page:
        create_link_artifact(page, link_text=f"Run {ctx.run_id} on the Training page",
                             key=run_report.artifact_key(project, run_report.RUN_PAGE),
                             description=f"Run {ctx.run_id} of {name}")


@_task("fetch-artifacts")
def fetch_artifacts_task(ctx: RunContext, backend, session, handle) -> None:
    backend.fetch_artifacts(ctx, session, handle)


@_task("report-to-trackers")
def report_to_trackers_task(ctx: RunContext) -> list[str]:
    return report_to_trackers(ctx)


@_task("clean-up")
def clean_up_task(ctx: RunContext, backend, session, handle) -> None:
    backend.clean_up(ctx, session, handle)


def _named(t, text: str):
    return t.with_options(task_run_name=text)


@flow(name="training-run", flow_run_name="run-{run_id}", persist_result=False, log_prints=False)
def training_run(
    config: str,
    run_id: int | None = None,
    trainer: str | None = None,
    schemas: list[str] | None = None,
    backend: str | None = None,
    options: dict | None = None,
):
    """Execute training run *run_id* of the project at *config* (or create one first).

    Without *trainer*, each schema is trained by its kind's default trainer (potato/trainer_choice.py).
    """
    os.umask(0o077)  # a Prefect worker may start this flow: what the run writes is private all the same
    if not _DISPATCHED:  # the parameter came from the Prefect API, not from Potato's own dispatcher
        prefect_runs.check_allowed_config(config)
    cfg = load_config(config)
    store = open_store(cfg)
    flow_run_id = _flow_run_id()
    if run_id is None:
        run_id = _create_own_run(cfg, store, flow_run_id, trainer=trainer, schemas=schemas, backend=backend,
                                 options=options)
        if run_id is None:
            return Cancelled(message="Potato's dispatcher took this run first; its own flow run executes it")
    else:
        # Before anything is written: a flow run given a run another flow run has must not touch it.
        store.record_flow(run_id, flow_run_id, os.getpid())
    _output_to_flow_log(run_paths(cfg, run_id).flow_log)
    if flow_run_id:
        prefect_runs.label_flow_run(flow_run_id, f"run-{run_id}", prefect_runs.flow_run_tags(cfg, store.get_run(run_id)))
    limit = prefect_runs.limit_name(cfg)
    ensure_concurrency_limit(limit, 1)
    cancel = _CancelFromPrefect(cfg, store, run_id)
    with CancelWatch(flow_run_id, cancel.request) as watch, _sigterm_cancels_under_a_worker(watch):
        with _the_projects_turn(store, run_id, limit) as run:
            if run.state != "running":
                return Cancelled(message=f"Run {run_id} is {run.state}; nothing to do")
            return _execute(cfg, store, run_id, cancel)


@contextmanager
def _the_projects_turn(store: Store, run_id: int, limit: str) -> Iterator:
    """Hold the project's Prefect slot and Potato's one-run-at-a-time slot; yield the run, ``running`` then.

    A run its own flow created waits ``queued``, its step row saying for what,
    so that its wait counts against no limit and the page shows one running
    run. Holding the Prefect slot while another run is running in the store
    (the dispatcher's, whose flow waits for that very slot) would wait
    forever: the slot is let go, and taken again a moment later. A run that
    ended meanwhile (cancelled while queued) is yielded as it is.
    """
    shown = None
    while True:
        with concurrency(limit, occupy=1, strict=True, lease_duration=LEASE_SECONDS):
            run = store.start(run_id)
            if run.state != "queued":
                yield run
                return
        busy = next((r.id for r in store.active_runs()), None)
        if busy is not None and busy != shown:
            store.update_run(run_id, step=f"waiting for run {busy} to finish")
            shown = busy
        time.sleep(TURN_RETRY_S)


def _output_to_flow_log(flow_log) -> None:
    """Write this process's output to the run's ``flow.log`` if it went into a pipe (a Prefect worker's).

    A process worker reads its flows' output through a pipe. Killed, it
    leaves that pipe without a reader, and the next log line the flow writes
    would fail with EPIPE, which Prefect's console handler (rich) turns into
    ``SystemExit``: the run would fail because its worker went, not because
    of anything it did. Its output in ``flow.log`` is where the dispatcher's
    flows write theirs and where Potato's messages send the reader; the
    Prefect UI has the flow's logs either way.
    """
    if not any(stat.S_ISFIFO(os.fstat(fd).st_mode) for fd in (1, 2)):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    private_dir(flow_log.parent)
    fd = os.open(flow_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def _create_own_run(cfg: ProjectConfig, store: Store, flow_run_id: str | None, **request) -> int | None:
    """Create the run a ``prefect deployment run`` (or a schedule) asked for, as this flow run's own.

    Queued, and adopted by this flow run at once, so that Potato's dispatcher,
    which starts only runs without a flow run, does not start a second flow
    for it; it becomes ``running`` once this flow holds the project's turn. If
    the dispatcher won the claim in the instant between, its flow executes
    the run and this one has nothing to do (None).
    """
    scheduled = _started_by_a_schedule()
    run = create_run(cfg, store, trigger=SCHEDULE if scheduled else MANUAL, **request)
    if not store.adopt(run.id, flow_run_id, os.getpid(), step="waiting for this project's turn"):
        return None
    from prefect.runtime import deployment

    source = f"deployment {training_run.name}/{deployment.name}" if deployment.id else f"flow {training_run.name}"
    how = "by a schedule of the" if scheduled else "in Prefect, from the"
    RunLog(store, run.id, run_paths(cfg, run.id).run_log).info(f"Run {run.id} was started {how} {source}")
    return run.id


def _started_by_a_schedule() -> bool:
    """Whether this flow run was created by one of its deployment's schedules."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return bool(client.read_flow_run(_flow_run_id()).auto_scheduled)


def _execute(cfg: ProjectConfig, store: Store, run_id: int, cancel: "_CancelFromPrefect"):
    run = store.get_run(run_id)
    backend_cfg = cfg.model_training.backends[run.backend]
    ctx = RunContext(cfg, store, run, backend_cfg, RunLog(store, run_id, run_paths(cfg, run_id).run_log))
    where = backend_cfg.host or "this machine"
    backend = session = handle = None
    final_state, error = "failed", None

    def step(t, name: str, *args):
        # Until the worker is spawned, a cancel (from Potato or Prefect) or the
        # wall-clock limit stops the run before its next step; from then on the
        # relay step watches both and stops the worker with its grace period.
        if handle is None:
            limit = check_limits(ctx, ctx.refresh(), time.time())
            if limit is not None:
                raise limit
        return _named(t, name)(ctx, *args)

    try:
        ctx.log.info(f"Run {run_id}: {describe_plan(run.trainers)} on {', '.join(run.schemas)}, "
                     f"on backend {backend_cfg.describe()}")
        backend = steps_of(backend_cfg)
        import_clients_early(cfg.model_training.report_to)
        step(build_bundle_task, f"build the bundle of run {run_id}")
        session = step(connect_task, f"connect to {where}", backend)
        step(pick_gpu_task, f"pick GPU on {where}", backend, session)
        step(sync_code_task, f"sync code to {where}", backend, session)
        handle = step(spawn_task, f"spawn the worker on {where}", backend, session)
        code = step(relay_events_task, f"relay events from {where}", backend, session, handle)
        if code != 0:
            raise RunError(describe_worker_failure(ctx, code))
        step(record_results_task, f"record results of run {run_id}")
        step(fetch_artifacts_task, f"fetch artifacts from {where}", backend, session, handle)
        if cfg.model_training.report_to:  # after the fetch: a tracker asked for the model finds it here
            step(report_to_trackers_task, f"report run {run_id} to {', '.join(cfg.model_training.report_to)}")
        final_state = "succeeded"
    except RunCancelled as exc:
        final_state = "cancelled"
        error = prefect_runs.CANCELLED_IN_PREFECT if cancel.requested else str(exc)
    except PotatoError as exc:
        error = str(exc)
        ctx.log.error(error)
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            error = str(DiskFull(ctx.run_dir))
            ctx.log.error(f"{error} ({exc})")
        else:
            error = f"Internal error: {type(exc).__name__}: {exc}"
            ctx.log.error(traceback.format_exc())
    except BaseException as exc:
        # Prefect's flow timeout arrives as a BaseException; the run still ends, with a reason.
        error = _describe_interruption(cfg, exc)
        ctx.log.error(error)
        raise
    finally:
        # A sign of life: reconciliation must not take a flow that is cleaning up for a wedged one.
        store.heartbeat(run_id)
        try:
            if backend is not None:
                _named(clean_up_task, f"clean up on {where}")(ctx, backend, session, handle)
        except Exception as exc:  # clean-up failing must not hide why the run ended
            ctx.log.error(f"Clean-up failed: {type(exc).__name__}: {exc}")
        # Ends the run only once what it started is verified gone; else reconciliation finishes it.
        end_run(cfg, store, run_id, final_state, error, log=ctx.log)
        _prune(cfg, store, ctx)
    if final_state == "cancelled":
        return Cancelled(message=prefect_runs.cancel_message(run_id, in_prefect=cancel.requested))
    if final_state != "succeeded":
        raise RunError(error)
    return store.get_run(run_id).scores


def _prune(cfg: ProjectConfig, store: Store, ctx: RunContext) -> None:
    """``retain_runs``: once this run has ended, older finished runs' directories go."""
    try:
        removed = prune_run_dirs(cfg, store)
    except OSError as exc:
        ctx.log.warning(f"Could not delete old run directories (model_training.retain_runs): {exc}")
        return
    if removed:
        ctx.log.info(f"Deleted the directories of run(s) {', '.join(map(str, removed))} "
                     f"(model_training.retain_runs: {cfg.model_training.retain_runs})")


def _describe_interruption(config: ProjectConfig, exc: BaseException) -> str:
    """Why the flow stopped when Prefect or a signal interrupted it."""
    # Inside a flow Prefect's own handler turns SIGTERM into TerminationSignal.
    if isinstance(exc, (SystemExit, TerminationSignal)):
        return "The flow process was stopped (SIGTERM) while the run was active"
    if isinstance(exc, KeyboardInterrupt):
        return "The flow process was interrupted while the run was active"
    limit = config.model_training.max_wall_seconds
    if limit:
        return str(WallTimeExceeded(limit))
    return f"The flow was interrupted: {type(exc).__name__}: {exc}"


def _flow_timeout_seconds(config: ProjectConfig) -> float | None:
    mt = config.model_training
    if not mt.max_wall_seconds:
        return None
    return mt.max_wall_seconds + mt.grace_seconds + FLOW_TIMEOUT_MARGIN_S


class _CancelFromPrefect:
    """Turns a cancel in Prefect into the store's cancel request, which the flow then carries out."""

    def __init__(self, cfg: ProjectConfig, store: Store, run_id: int):
        self.store = store
        self.run_id = run_id
        self.grace = cfg.model_training.grace_seconds
        self.log = RunLog(store, run_id, run_paths(cfg, run_id).run_log)
        self.requested = False

    def request(self) -> None:
        run = self.store.get_run(self.run_id)
        if run.is_finished or run.cancel_requested_at:
            return
        self.requested = True
        self.store.request_cancel(self.run_id)
        self.log.warning(f"The flow run was cancelled in Prefect: cancelling run {self.run_id} as Cancel run does "
                         f"(SIGTERM, then SIGKILL after {self.grace:g} s)")


@contextmanager
def _sigterm_cancels_under_a_worker(watch: CancelWatch) -> Iterator[None]:
    """Under a Prefect worker, make SIGTERM request the run's cancel instead of interrupting the flow.

    A process worker cancels a flow run by sending its process SIGTERM, then
    SIGKILL 30 s later. Prefect's own handler would raise in the middle of
    whatever step runs, and the worker (in a session of its own) would be
    killed by clean-up without its grace period; as a cancel request, the
    relay step stops it the way Cancel run does (TERM, grace_seconds, KILL).
    The dispatcher's child flows keep SIGTERM as "the server is stopping"
    (``Dispatcher.stop``).
    """
    from prefect.runtime import deployment

    if _DISPATCHED or not deployment.id or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: watch.trigger())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _ProgressArtifact:
    """Mirrors the run's progress into a Prefect progress artifact, at most once a second."""

    def __init__(self, ctx: RunContext):
        self.id = None
        self.last = 0.0
        self.ctx = ctx

    def update(self, fraction: float, text: str) -> None:
        now = time.monotonic()
        if now - self.last < 1.0 and fraction < 1.0:
            return
        self.last = now
        try:
            if self.id is None:
                self.id = create_progress_artifact(progress=100 * fraction, description=text)
            else:
                update_progress_artifact(self.id, progress=100 * fraction, description=text)
        except Exception as exc:  # tracing is a mirror; never fail a run over it
            self.ctx.log.debug(f"Progress artifact not updated: {exc}")


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None


def main(argv: list[str] | None = None) -> int:
    """Run one queued run: ``python -m flows.training_run --config C --run-id N``."""
    parser = argparse.ArgumentParser(prog="python -m flows.training_run")
    parser.add_argument("--config", required=True)
    parser.add_argument("--run-id", type=int, required=True)
    args = parser.parse_args(argv)
    from potato.runs.prefect_api import install_sigterm_exit

    install_sigterm_exit()
    global _DISPATCHED
    _DISPATCHED = True
    cfg = load_config(args.config)
    flow = training_run.with_options(timeout_seconds=_flow_timeout_seconds(cfg))
    parameters = {"config": str(cfg.path), "run_id": args.run_id}
    store = open_store(cfg)
    run = store.get_run(args.run_id)
    flow_run = prefect_runs.create_dispatched_flow_run(flow, parameters, f"run-{run.id}",
                                                       prefect_runs.flow_run_tags(cfg, run))
    state = run_flow(flow, flow_run=flow_run, parameters=parameters, return_type="state")
    after_flow(cfg, store, args.run_id, state)
    return 0 if state.is_completed() else 1


if __name__ == "__main__":
    sys.exit(main())
