"""The run queue: create a run (checked against the config and the registries), cancel one.

The store is the truth about runs. A run is created ``queued``; the
dispatcher (``potato.runs.dispatcher``) starts the oldest queued run when
none is active. Whatever the backend, one run executes at a time.
"""

from __future__ import annotations

import getpass

from potato.config import ProjectConfig
from potato.errors import LocalOnlyTrainerError, RunRequestError, UnknownBackendError, UnknownTrainerError
from potato.runs import prefect_runs
from potato.runs.jobs import options_with
from potato.runs.paths import private_dir, run_paths
from potato.runs.store import END_STATES, Run, Store
from potato.trainer_choice import default_schemas, plan_trainers
from potato.training.trainers.registry import TRAINERS, check_run_options, check_run_schemas


def create_run(
    config: ProjectConfig,
    store: Store,
    *,
    trainer: str | None = None,
    schemas: list[str] | None = None,
    backend: str | None = None,
    options: dict | None = None,
    trigger: str = "manual",
    annotation_count: int | None = None,
    only_when_idle: bool = False,
) -> Run | None:
    """Queue a run after checking trainer, schemas and backend against the config.

    Without *trainer*, each schema goes to its kind's default trainer, so the
    run may have several (``potato.trainer_choice``); a named trainer must
    train every schema (``NoTrainerFor`` otherwise).

    *trigger*, *annotation_count* and *only_when_idle* go to ``Store.create_run``
    (None when *only_when_idle* and a run is queued or running).
    """
    if trainer is not None and trainer not in TRAINERS:
        raise UnknownTrainerError(trainer, TRAINERS)
    backend = backend or config.model_training.backend or "local"
    if backend not in config.model_training.backends:
        raise UnknownBackendError(backend, config.model_training.backends)
    declared = config.model_training.backends[backend].type_info
    known = [s.name for s in config.schemes]
    named = bool(schemas)
    schemas = schemas or default_schemas(config, trainer)
    if not schemas:
        raise RunRequestError("No schema to train: name one of the config's annotation_schemes "
                              f"({', '.join(known) or 'there are none'})")
    for schema in schemas:
        if schema not in known:
            raise RunRequestError(f"Unknown schema {schema!r}; the config's annotation_schemes are: {', '.join(known)}")
    if options is not None and not isinstance(options, dict):
        raise RunRequestError("options must be a JSON object of trainer options")
    if trainer is not None and not named:
        # The schemas a run takes by default are those its trainer trains under the run's options (hf-llm-finetune:
        # answers with objective sft, comparisons with dpo); when none is, the check below says why.
        given = options_with(config, trainer, options)
        schemas = [s for s in schemas if not check_run_schemas(trainer, given, [(s, config.scheme(s).kind)])] or schemas
    plan = plan_trainers([config.scheme(s) for s in schemas], trainer)  # NoTrainerFor names the schema
    for name in plan:
        info = TRAINERS[name]
        if info.local_only and not declared.on_this_machine:
            raise LocalOnlyTrainerError(name, backend, declared.what, info.local_only)
        # What the worker would refuse once the run starts (an option's value, hf-llm-finetune without a
        # model) is refused now, before anything is queued.
        given = options_with(config, name, options)
        problems = check_run_options(name, given) or check_run_schemas(
            name, given, [(s, config.scheme(s).kind) for s in plan[name]])
        if problems:
            raise RunRequestError("; ".join(p if p.startswith(name) else f"{name}: {p}" for p in problems))
    run = store.create_run(" + ".join(plan), list(schemas), backend, options or {}, trigger=trigger,
                           annotation_count=annotation_count, only_when_idle=only_when_idle, plan=plan)
    if run is not None:
        private_dir(run_paths(config, run.id).dir)
    return run


# Who asked for a cancel, as the run's error and log say it ("Cancelled from the Training page …").
CANCELLED_FROM_PAGE = "from the Training page (Cancel run)"
CANCELLED_FROM_API = "through the admin API (X-API-Key)"


def by_account(command: str) -> str:
    """Who acted from a terminal (a cancel, a promote): the command and the account that ran it."""
    return f"with {command}, by the account {getpass.getuser()}"


def cancel_run(config: ProjectConfig, store: Store, run_id: int, *, by: str | None = None) -> Run:
    """Cancel *run_id*: a queued run ends at once; an active one is stopped by its flow.

    *by* says who asked (``CANCELLED_FROM_PAGE``, …): the run's log gets a ``cancel`` event saying so, and
    the run's error names them (``cancelled_message``). A run handed to a Prefect work pool that no worker
    has started yet has no flow to stop it: its flow run is cancelled in Prefect and the run ends now.
    """
    run = store.get_run(run_id)
    if run.state in END_STATES:
        return run
    said = f", {by}" if by else ""
    if store.transition(run_id, "cancelled", from_states=("queued",), error=f"Cancelled before it started{said}"):
        return store.get_run(run_id)
    if by and run.cancel_requested_at is None:
        store.add_event(run_id, "cancel", {"by": by})
    # Requested first: should a worker start the flow this instant, the flow sees it before spawning.
    run = store.request_cancel(run_id)
    if prefect_runs.waits_for_a_worker(run):
        return prefect_runs.cancel_before_a_worker(config, store, run)
    return run


def cancelled_message(store: Store, run_id: int) -> str:
    """The error of a run that a cancel request stopped: "Cancelled" and who asked, as ``cancel_run`` was told."""
    asked = [e.data.get("by") for e in store.events(run_id) if e.kind == "cancel"]
    return f"Cancelled {asked[-1]}" if asked and isinstance(asked[-1], str) else "Cancelled by request"
