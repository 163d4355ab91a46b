"""Cold start on the server: when ``potato start`` queues a ``cold-start`` run, and what its results do.

Under ``assignment_strategy: model_review`` Potato 2.12 serves only items that
hold a prediction, so before the first model it serves nothing. The
``cold-start`` trainer (``potato.training.trainers.cold_start``) orders the unlabelled
items without a model; here:

- ``start_if_needed``: ``potato start`` queues one such run (trigger
  ``cold-start``, on ``model_training.backend``) when the project serves by
  ``model_review`` with a live writeback of at least one schema whose payload
  can hold a place (``writeback_shapes.CONFIDENCE_ONLY_TYPES``) and whose kind
  the cold start orders (not a comparison or a ranking), nothing is
  written back yet, no cold-start run was ever queued, and no run is queued
  or running. Once, so a failed cold start is not retried at every start
  (start one by hand: ``potato training run config.yaml --trainer
  cold-start``).
- ``record``: its record-results hook. The order lines become places that
  pre-fill nothing (the usual writeback and live writeback,
  ``potato.prefill.review_order``); but a model's predictions already written back
  for a schema are never replaced by a cold start's places: then nothing is
  written and the run log says why.
"""

from __future__ import annotations

from typing import Any

from potato.backends.base import RunContext
from potato.config import MODEL_REVIEW, ProjectConfig, assignment_strategy
from potato.prefill.review_order import is_order_only, strip_order
from potato.prefill.writeback_shapes import CONFIDENCE_ONLY_TYPES
from potato.results.live_writeback import publish
from potato.results.writeback import writeback_lock, writeback_path
from potato.runs.store import COLD_START, Run, Store
from potato.training.trainers.cold_start import NAME
from potato.training.trainers.registry import TRAINERS


def cold_start_schemas(config: ProjectConfig) -> list[str]:
    """The schemas of ``writeback.schemas`` a cold start orders: those of the kinds it takes (not a comparison,
    whose two sides it does not embed)."""
    kinds = {s.name: s.kind for s in config.schemes}
    return [name for name in config.model_training.writeback.schemas if kinds.get(name) in TRAINERS[NAME].kinds]


def needs_cold_start(config: ProjectConfig) -> bool:
    """Whether a project would serve nothing under model_review until a model exists, and a cold start can fix it."""
    wb = config.model_training.writeback
    if assignment_strategy(config.raw) != MODEL_REVIEW or not wb.live or not wb.include_unlabeled:
        return False
    types = {s.name: s.annotation_type.strip().lower() for s in config.schemes}
    return any(types.get(name) in CONFIDENCE_ONLY_TYPES for name in cold_start_schemas(config))


def _written_back(config: ProjectConfig) -> bool:
    path = writeback_path(config)
    return path.is_file() and path.stat().st_size > 0


def start_if_needed(config: ProjectConfig, store: Store) -> Run | None:
    """Queue the project's cold-start run if it needs one (module docstring); the run, or None."""
    from potato.runs.queue import create_run

    if not needs_cold_start(config) or _written_back(config) or store.latest_run(trigger=COLD_START) is not None:
        return None
    return create_run(config, store, trainer=NAME, schemas=cold_start_schemas(config),
                     trigger=COLD_START, only_when_idle=True)


def started_text(run: Run) -> str:
    """What ``potato start`` says when it queued a cold start."""
    return (f"Cold start: run {run.id} orders the unlabelled items of {', '.join(run.schemas)} by the shipped "
            "encoder's embeddings, so that model_review serves a diverse first batch before any model")


def _model_predictions(config: ProjectConfig, schemas: list[str]) -> list[str]:
    """The schemas among *schemas* for which the writeback file holds a model's prediction."""
    import json

    field_name, found = config.model_training.writeback.field, set()
    try:
        handle = open(writeback_path(config), encoding="utf-8")
    except FileNotFoundError:
        return []
    with handle:
        for line in handle:
            record: Any = json.loads(line) if line.strip() else {}
            for schema, payload in (record.get(field_name) or {}).items():
                if schema in schemas and not is_order_only(payload) and strip_order(payload) is not None:
                    found.add(schema)
    return sorted(found)


def record(ctx: RunContext) -> None:
    """The cold-start run's results: its order written back, unless a model's predictions are there already."""
    from potato.results.record_results import log_live

    schemas = [s for s in ctx.run.schemas if s in ctx.config.model_training.writeback.schemas]
    with writeback_lock(ctx.config):
        taken = _model_predictions(ctx.config, schemas)
    if taken:
        ctx.log.warning(f"Cold start: nothing written back: a model's predictions of {', '.join(taken)} are "
                        "written back already, and their order stands")
        return
    summary, live = publish(ctx.config, ctx.run_id, ctx.run.schemas, ctx.paths.predictions, ctx.bundle_dir)
    bad_lines = summary.describe_bad_lines(ctx.paths.predictions)
    if bad_lines:
        ctx.log.warning(bad_lines)
    ctx.log.info(summary.describe())
    log_live(ctx.log, live)
