"""A Potato run as a Prefect flow run: its project's limit and tags, and cancel in both directions.

**Many projects, one Prefect.** Several Potato projects may point at one
Prefect server (``PREFECT_API_URL``). Each keeps its own one-run-at-a-time
rule, so the concurrency limit every training flow holds is the project's
own, ``potato-training-<project>``, and every flow run carries the tags
``potato``, ``project:<project>``, ``backend:<name>`` and ``trainer:<name>``:
a Prefect user finds a project's limit under Concurrency and filters its runs
by tag. ``<project>`` is the slug of ``annotation_task_name`` plus six hex
digits of a hash of the project's training directory (where its run store
lives): two projects with the same task name still get two limits, and every
process that works on one project (the server, the CLI, a Prefect worker)
computes the same name without asking anyone.

**Cancel, both ways.** The store is the truth about runs, so a cancel from
Prefect becomes the store's cancel request and the flow carries it out
exactly as it carries out **Cancel run** (TERM, ``grace_seconds``, KILL;
state ``cancelled``). A flow running in its own process does not notice
``prefect flow-run cancel``: ``CancelWatch``
polls the flow run's state once a second for that. The other way, the flow
ends in a Cancelled state whose message says where the cancel came from
(``cancel_message``); a deployment's flow run that no worker has started
yet is cancelled in Prefect directly (``cancel_flow_run``).

Pure functions on top (no Prefect import); below, the few calls to the API.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Callable

from potato.errors import NoPrefectWorker
from potato.runs.ending import end_run
from potato.runs.prefect_api import LIMIT_NAME
from potato.training import atomic_files

log = logging.getLogger(__name__)

# How often CancelWatch asks Prefect about the flow run: as often as the
# relay step checks the store for Potato's own cancel requests.
WATCH_SECONDS = 1.0
_SLUG_MAX = 40

CANCELLED_IN_PREFECT = "Cancelled in Prefect"

DISPATCHER_DEPLOYMENT = "potato-dispatcher"
DISPATCHER_DEPLOYMENT_DESCRIPTION = (
    "The runs Potato started itself, each in a child process of the annotation server or of "
    "`potato training run`. It has no work pool: never start it from here (its runs would wait "
    "for a worker forever); use training-run/potato with a worker for that.")


# The configs the flow accepts from a Prefect flow run's parameters, when it exists: written by
# ``python -m deployments.create --allow-config``, on the host whose worker runs the flows.
ALLOW_LIST = Path(__file__).resolve().parents[1] / "deployments" / "allowed-configs.json"


def read_allow_list(path: Path | None = None) -> list[str] | None:
    """The allowed configs (resolved paths), or None when there is no allow-list (every config is allowed)."""
    try:
        return [str(p) for p in json.loads((path or ALLOW_LIST).read_text(encoding="utf-8"))]
    except FileNotFoundError:
        return None


def allow_configs(paths: list[str], path: Path | None = None) -> list[str]:
    """Add *paths* (resolved) to the allow-list, creating it; return the list."""
    path = path or ALLOW_LIST
    allowed = list(dict.fromkeys((read_allow_list(path) or []) + [os.path.realpath(p) for p in paths]))
    atomic_files.write_text(path, json.dumps(allowed, indent=1) + "\n")
    return allowed


def check_allowed_config(config: str, path: Path | None = None) -> None:
    """Raise ``ConfigNotAllowed`` when an allow-list exists and *config* (resolved) is not in it.

    Called before the config is read: a Prefect flow run's parameters come
    from whoever can reach the Prefect API, and reading an arbitrary path on
    the worker's host (its contents in an error message, say) is what the
    allow-list prevents.
    """
    from potato.errors import ConfigNotAllowed

    allowed = read_allow_list(path)
    if allowed is not None and os.path.realpath(config) not in allowed:
        raise ConfigNotAllowed(config, allowed, str(path or ALLOW_LIST))


def project_key(task_name: str, training_dir) -> str:
    """Return the project's name on a shared Prefect, e.g. ``review-sentiment-3f9a1c``."""
    slug = re.sub(r"[^a-z0-9]+", "-", (task_name or "").lower()).strip("-")[:_SLUG_MAX].strip("-")
    digest = hashlib.sha256(str(training_dir).encode("utf-8", "surrogateescape")).hexdigest()[:6]
    return f"{slug or 'project'}-{digest}"


def project_key_of(config) -> str:
    """Return the name on a shared Prefect of the project *config* describes."""
    return project_key(config.annotation_task_name, config.training_dir.resolve())


def limit_name(config) -> str:
    """Return the project's concurrency limit: ``potato-training-<project>`` (limit 1)."""
    return f"{LIMIT_NAME}-{project_key_of(config)}"


def flow_run_tags(config, run) -> list[str]:
    """Return the tags of *run*'s flow run: ``potato``, ``project:…``, ``backend:…``, ``trainer:…``."""
    return ["potato", f"project:{project_key_of(config)}", f"backend:{run.backend}",
            *(f"trainer:{trainer}" for trainer in run.trainers)]


def cancel_message(run_id: int, *, in_prefect: bool) -> str:
    """Return the message of the Cancelled state a cancelled run's flow run ends in."""
    where = "in Prefect" if in_prefect else "in Potato (Cancel run)"
    return f"Run {run_id} was cancelled {where}; its worker was stopped"


def is_cancel(state) -> bool:
    """Return whether a flow run *state* asks for the run to stop (Cancelling, or already Cancelled)."""
    return state is not None and (state.is_cancelling() or state.is_cancelled())


# -- the API ------------------------------------------------------------------


def label_flow_run(flow_run_id: str, name: str, tags: list[str]) -> None:
    """Name flow run *flow_run_id* and add *tags* to the tags it already has."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        current = client.read_flow_run(flow_run_id)
        merged = list(dict.fromkeys([*(current.tags or []), *tags]))
        client.update_flow_run(flow_run_id, name=name, tags=merged)


def create_dispatched_flow_run(flow, parameters: dict, name: str, tags: list[str]):
    """Create the flow run that a dispatcher's child process then executes itself (``run_flow``).

    It belongs to the deployment ``training-run/potato-dispatcher``, which has
    no work pool (no worker ever picks its runs up): the Prefect UI offers
    **Cancel** only for a deployment's flow runs, and a run Potato started
    must be as cancellable there as one a worker started.
    """
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        deployment_id = client.create_deployment(  # an upsert: the same id every time
            flow_id=client.create_flow_from_name(flow.name),
            name=DISPATCHER_DEPLOYMENT,
            description=DISPATCHER_DEPLOYMENT_DESCRIPTION,
            tags=["potato"],
            enforce_parameter_schema=False,
        )
        return client.create_flow_run_from_deployment(deployment_id, parameters=parameters, name=name, tags=tags)


def read_state(flow_run_id: str):
    """Return the current state of flow run *flow_run_id*."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state


def cancel_flow_run(flow_run_id: str, message: str) -> str | None:
    """Cancel flow run *flow_run_id* with *message*; return its work pool's name.

    A flow run no worker has started (Scheduled, Pending) becomes Cancelled at
    once: there is nothing to stop. A started one becomes Cancelling, as with
    ``prefect flow-run cancel``, and its worker and flow stop it.
    """
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Cancelling

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)
        unstarted = flow_run.state is not None and (flow_run.state.is_scheduled() or flow_run.state.is_pending())
        client.set_flow_run_state(flow_run_id, (Cancelled if unstarted else Cancelling)(message=message))
        return flow_run.work_pool_name


# -- runs handed to a work pool ------------------------------------------------------


def waits_for_a_worker(run) -> bool:
    """Whether *run* was handed to a Prefect work pool and no worker has started its flow yet."""
    return run.state == "running" and run.flow_pid is None and bool(run.prefect_flow_run_id)


def no_worker_in_time(config, run, now: float) -> bool:
    """Whether *run* has waited for a Prefect worker past ``max_wall_seconds`` since Potato queued it on the pool.

    The wait counts against the run's wall-clock limit: the run holds
    Potato's one-run-at-a-time slot all along, as a run on any backend does
    from the moment it is started.
    """
    limit = config.model_training.max_wall_seconds
    return bool(limit) and waits_for_a_worker(run) and now - (run.started_at or now) > limit


def fail_runs_no_worker_started(config, store, now: float | None = None) -> list:
    """Fail the runs that no Prefect worker started within ``max_wall_seconds``, naming the pool.

    The dispatcher calls it on every pass while ``prefect_deployment`` is set.
    Each run's flow run is cancelled in Prefect, so a worker that comes later
    does not start it.
    """
    now = time.time() if now is None else now
    failed = []
    for run in store.active_runs():
        if no_worker_in_time(config, run, now):
            pool = _give_up_flow_run(run, "No Prefect worker started it in time")
            error = NoPrefectWorker(run.id, pool, config.model_training.max_wall_seconds)
            failed.append(end_run(config, store, run.id, "failed", str(error)))
    return failed


def cancel_before_a_worker(config, store, run):
    """End *run*, which no Prefect worker has started, as cancelled, and cancel its flow run in Prefect."""
    _give_up_flow_run(run, "Cancelled in Potato before a Prefect worker started it")
    return end_run(config, store, run.id, "cancelled", "Cancelled before a Prefect worker started it")


def _give_up_flow_run(run, message: str) -> str | None:
    """Cancel in Prefect the flow run of *run* that no worker started; return its work pool's name."""
    try:
        return cancel_flow_run(run.prefect_flow_run_id, message)
    except Exception as exc:  # Prefect down: a worker that starts the flow later finds the run ended
        log.warning("Could not cancel flow run %s in Prefect: %s", run.prefect_flow_run_id, exc)
        return None


class CancelWatch:
    """Calls *on_cancel* once when flow run *flow_run_id* is cancelled in Prefect.

    A daemon thread reads the flow run's state every *interval* seconds while
    the ``with`` block runs. Prefect being unreachable for a while is logged
    at debug and retried: the run goes on, and Potato's own cancel still works.
    ``trigger()`` fires it at once without asking Prefect; it only sets an
    event, so a signal handler may call it (the handler interrupts the main
    thread, possibly inside a store write, where *on_cancel* must not run).
    """

    def __init__(self, flow_run_id: str | None, on_cancel: Callable[[], None], *,
                 interval: float = WATCH_SECONDS, read: Callable = read_state):
        self.flow_run_id = flow_run_id
        self.on_cancel = on_cancel
        self.interval = interval
        self.read = read
        self._triggered = threading.Event()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "CancelWatch":
        self._thread = threading.Thread(target=self._watch, name="potato-prefect-cancel-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=self.interval + 5)

    def trigger(self) -> None:
        """Fire as if Prefect had said Cancelling (e.g. on the worker's SIGTERM)."""
        self._triggered.set()
        self._wake.set()

    def _cancelled_in_prefect(self) -> bool:
        if not self.flow_run_id:
            return False
        try:
            return is_cancel(self.read(self.flow_run_id))
        except Exception as exc:  # the run must not fail because its mirror is down
            log.debug("Could not read the state of flow run %s: %s", self.flow_run_id, exc)
            return False

    def _watch(self) -> None:
        while True:
            self._wake.wait(self.interval)
            if self._stop.is_set():
                return
            if self._triggered.is_set() or self._cancelled_in_prefect():
                self.on_cancel()
                return
