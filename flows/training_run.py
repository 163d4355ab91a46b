"""THE flow: one training run, as the seven steps of DESIGN.md.

    build bundle → connect → pick GPU → sync code → spawn → relay events
    → (record results, write back) → fetch artifacts → clean up

Each step is a Prefect task named for what it does on this run, so the Prefect
UI traces a run the way its log reads. Step bodies live in ``potato.tasks.<backend>``
and test without Prefect; the tasks here only call them. Clean-up runs in
``finally:``, so failures, timeouts and cancels run it too.

Started by the dispatcher as ``python -m flows.training_run --config C --run-id N``
(the flow then owns its process's main thread, so Prefect's timeout interrupts
blocking calls), by a Prefect work pool through the deployment
``training-run/potato``, or by ``prefect deployment run`` with ``config`` and
``backend`` parameters, in which case the flow creates the run record itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency
from prefect.states import Cancelled

from potato import runs
from potato.config import ProjectConfig, load_config
from potato.errors import PotatoError, RunCancelled, RunError
from potato.project import build_bundle, describe_bundle
from potato.runlog import RunLog
from potato.store import Store
from potato.tasks.base import RunContext, backend_module
from potato.tasks.openssh import is_transient
from potato.tasks.relay import watch
from potato.writeback import write_back

# The slot's lease is renewed while the flow lives; a flow killed with -9 frees
# it once the lease expires (notes/prefect-3.md).
LEASE_SECONDS = 60


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
    return {"items": info.items, "labeled": info.labeled, "holdout": info.holdout}


def _retry_transient_ssh(task, task_run, state) -> bool:
    try:
        state.result()
    except Exception as exc:
        return is_transient(exc)
    return False


# Connecting is the one step retried: it is idempotent, and only a flaky network is retried.
@task(name="connect", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=[5, 15],
      retry_condition_fn=_retry_transient_ssh)
def connect_task(ctx: RunContext, backend) -> Any:
    return backend.connect(ctx)


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
def relay_events_task(ctx: RunContext, backend, session, handle) -> int:
    progress = _ProgressArtifact(ctx)
    ctx.extra["on_progress"] = progress.update
    return watch(ctx, session, handle, backend, heartbeat_timeout=runs.heartbeat_timeout(ctx.config, ctx.run.backend))


@_task("record-results")
def record_results_task(ctx: RunContext) -> dict:
    scores = runs.read_scores(ctx.run_dir)
    ctx.store.update_run(ctx.run_id, scores=scores)
    for schema, s in scores.items():
        ctx.log.info(
            f"Holdout {schema}: accuracy {s.get('accuracy', 0):.3f}, macro-F1 {s.get('macro_f1', 0):.3f} (n={s.get('n', 0)})"
        )
    if scores:
        create_table_artifact(
            [{"schema": k, **v} for k, v in scores.items()],
            key=f"run-{ctx.run_id}-scores",
            description=f"Holdout scores of run {ctx.run_id}",
        )
    summary = write_back(ctx.config, ctx.run_id, ctx.run_dir / "predictions.jsonl")
    ctx.log.info(summary.describe())
    return scores


@_task("fetch-artifacts")
def fetch_artifacts_task(ctx: RunContext, backend, session, handle) -> None:
    backend.fetch_artifacts(ctx, session, handle)


@_task("clean-up")
def clean_up_task(ctx: RunContext, backend, session, handle) -> None:
    backend.clean_up(ctx, session, handle)


def _named(t, text: str):
    return t.with_options(task_run_name=text)


@flow(name="training-run", flow_run_name="run-{run_id}", persist_result=False, log_prints=False)
def training_run(
    config: str,
    run_id: int | None = None,
    trainer: str = runs.DEFAULT_TRAINER,
    schemas: list[str] | None = None,
    backend: str | None = None,
    options: dict | None = None,
):
    """Execute training run *run_id* of the project at *config* (or create one first)."""
    os.umask(0o077)  # a Prefect worker may start this flow: what the run writes is private all the same
    cfg = load_config(config)
    store = runs.open_store(cfg)
    if run_id is None:
        run_id = runs.create_run(cfg, store, trainer=trainer, schemas=schemas, backend=backend, options=options).id
        _rename_flow_run(f"run-{run_id}")
    store.update_run(run_id, prefect_flow_run_id=_flow_run_id(), flow_pid=os.getpid())
    runs.ensure_prefect_limit()
    with concurrency(runs.CONCURRENCY_LIMIT, occupy=1, strict=True, lease_duration=LEASE_SECONDS):
        run = store.get_run(run_id)
        if run.state not in ("queued", "running"):
            return Cancelled(message=f"Run {run_id} is {run.state}; nothing to do")
        if run.state == "queued":
            store.transition(run_id, "running", from_states=("queued",))
        return _execute(cfg, store, run_id)


def _execute(cfg: ProjectConfig, store: Store, run_id: int):
    run = store.get_run(run_id)
    backend_cfg = cfg.model_training.backends[run.backend]
    ctx = RunContext(cfg, store, run, backend_cfg, RunLog(store, run_id, runs.run_dir(cfg, run_id) / "run.log"))
    where = backend_cfg.host or "this machine"
    backend = session = handle = None
    final_state, error = "failed", None
    try:
        ctx.log.info(f"Run {run_id}: {run.trainer} on {', '.join(run.schemas)}, on backend {backend_cfg.describe()}")
        backend = backend_module(backend_cfg)
        _named(build_bundle_task, f"build the bundle of run {run_id}")(ctx)
        session = _named(connect_task, f"connect to {where}")(ctx, backend)
        _named(pick_gpu_task, f"pick GPU on {where}")(ctx, backend, session)
        _named(sync_code_task, f"sync code to {where}")(ctx, backend, session)
        handle = _named(spawn_task, f"spawn the worker on {where}")(ctx, backend, session)
        code = _named(relay_events_task, f"relay events from {where}")(ctx, backend, session, handle)
        if code != 0:
            raise RunError(runs.describe_worker_failure(ctx, code))
        _named(record_results_task, f"record results of run {run_id}")(ctx)
        _named(fetch_artifacts_task, f"fetch artifacts from {where}")(ctx, backend, session, handle)
        final_state = "succeeded"
    except RunCancelled as exc:
        final_state, error = "cancelled", str(exc)
    except PotatoError as exc:
        error = str(exc)
        ctx.log.error(error)
    except Exception as exc:
        error = f"Internal error: {type(exc).__name__}: {exc}"
        ctx.log.error(traceback.format_exc())
    except BaseException as exc:
        # Prefect's flow timeout arrives as a BaseException; the run still ends, with a reason.
        error = runs.describe_interruption(cfg, exc)
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
        runs.end_run(cfg, store, run_id, final_state, error, log=ctx.log)
    if final_state == "cancelled":
        return Cancelled(message=error)
    if final_state != "succeeded":
        raise RunError(error)
    return store.get_run(run_id).scores


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


def _rename_flow_run(name: str) -> None:
    from prefect.client.orchestration import get_client

    flow_run_id = _flow_run_id()
    if flow_run_id:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run_id, name=name)


def main(argv: list[str] | None = None) -> int:
    """Run one queued run: ``python -m flows.training_run --config C --run-id N``."""
    parser = argparse.ArgumentParser(prog="python -m flows.training_run")
    parser.add_argument("--config", required=True)
    parser.add_argument("--run-id", type=int, required=True)
    args = parser.parse_args(argv)
    from potato.prefect_api import install_sigterm_exit

    install_sigterm_exit()
    cfg = load_config(args.config)
    timeout = runs.flow_timeout_seconds(cfg)
    state = training_run.with_options(timeout_seconds=timeout)(
        config=str(cfg.path), run_id=args.run_id, return_state=True
    )
    runs.after_flow(cfg, args.run_id, state)
    return 0 if state.is_completed() else 1


if __name__ == "__main__":
    sys.exit(main())
