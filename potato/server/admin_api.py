"""The admin API (``/admin/training/api``): JSON for the Training page and for scripts.

Every route needs the admin key (``X-API-Key``) or the page's session; see
``potato.server.auth``. Views are thin: read the request, call ``potato.runs``,
the registries or the store, answer JSON. Errors are JSON (``potato.protocol.jsonapi``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from flask import Blueprint, current_app, jsonify, request

from potato.backends.checks import check_backend
from potato.errors import (
    CompareError,
    LocalOnlyTrainerError,
    PromoteError,
    RetractError,
    RunRequestError,
    UnknownBackendError,
    WritebackError,
)
from potato.protocol.jsonapi import ApiError, json_body
from potato.results.evaluation import read_evaluation
from potato.results.promote import pin, promote
from potato.results.retract import retract
from potato.run_comparison import compare, parse_runs
from potato.runs import queue
from potato.runs.paths import run_paths
from potato.runs.store import MAX_RUN_ID
from potato.server.auth import admin_via, require_admin
from potato.server.context import get_config, get_store
from potato.server.serialize import (
    Shown,
    backends_json,
    event_json,
    run_json,
    schemas_json,
    trainers_json,
    writeback_json,
)
from potato.trainer_choice import NoTrainerFor, default_schemas
from potato.training.trainers.registry import DEFAULT_BY_KIND

bp = Blueprint("admin_api", __name__, url_prefix="/admin/training/api")

MAX_LIST = 500
MAX_EVENTS = 1000
MAX_ARTIFACTS = 500
PREDICTION_SAMPLE = 20


def int_arg(name: str, default: int, *, minimum: int = 0, maximum: int = MAX_RUN_ID) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"Query parameter {name!r} is {raw!r}; use a whole number") from None
    if not minimum <= value <= maximum:
        raise ApiError(400, f"Query parameter {name!r} is {value}; use a whole number from {minimum} to {maximum}")
    return value


def _claimed(run) -> bool:
    return current_app.extensions["potato.agent_state"].is_claimed(get_store(), run)


def _run_json(run, shown: Shown | None = None) -> dict[str, Any]:
    config = get_config()
    backend = config.model_training.backends.get(run.backend)
    # Only a running agent run can be "queued in the UI's sense" (waiting for its claim).
    claimed = (run.state == "running" and backend is not None and backend.type_info.claimed_by_agent
               and _claimed(run))
    return run_json(config, get_store(), run, claimed=claimed, ui_url=current_app.config.get("PREFECT_UI_URL"),
                    shown=shown)


@bp.get("/runs")
@require_admin
def list_runs():
    store = get_store()
    limit = int_arg("limit", 50, minimum=1, maximum=MAX_LIST)
    offset = int_arg("offset", 0)
    listed = store.list_runs(limit=limit, offset=offset)
    shown = Shown.now(get_config())  # the writeback file read once for the whole list
    return jsonify({"runs": [_run_json(r, shown) for r in listed], "total": store.count_runs(),
                    "limit": limit, "offset": offset})


@bp.post("/runs")
@require_admin
def create_run():
    body = json_body()
    unknown = sorted(set(body) - {"trainer", "schemas", "backend", "options"})
    if unknown:
        raise ApiError(400, f"Unknown field(s) {', '.join(map(repr, unknown))}; "
                       "a run request has trainer, schemas, backend and options")
    trainer = body.get("trainer")
    if trainer is not None and not isinstance(trainer, str):
        raise ApiError(400, "trainer must be a string, e.g. \"hf-text-classification\"")
    schemas = body.get("schemas")
    if schemas is not None and not (isinstance(schemas, list) and all(isinstance(s, str) for s in schemas)):
        raise ApiError(400, "schemas must be a list of schema names, e.g. [\"sentiment\"]")
    backend = body.get("backend")
    if backend is not None and not isinstance(backend, str):
        raise ApiError(400, "backend must be a string naming a backend of model_training.backends")
    options = body.get("options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "options must be a JSON object of trainer options, e.g. {\"epochs\": 3}")
    config = get_config()
    try:
        run = queue.create_run(config, get_store(), trainer=trainer, schemas=schemas, backend=backend, options=options)
    except UnknownBackendError as exc:
        raise ApiError(409, str(exc), known_backends=exc.known) from None
    except (LocalOnlyTrainerError, NoTrainerFor) as exc:
        raise ApiError(409, str(exc)) from None
    except RunRequestError as exc:
        raise ApiError(400, str(exc)) from None
    response = jsonify({"run": _run_json(run)})
    response.status_code = 201
    response.headers["Location"] = f"{bp.url_prefix}/runs/{run.id}"
    return response


def _artifacts(directory: Path) -> list[dict[str, Any]]:
    found = []
    if not directory.is_dir():
        return found
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            try:
                size = path.stat().st_size
            except OSError:
                continue
            found.append({"path": path.relative_to(directory).as_posix(), "bytes": size})
            if len(found) >= MAX_ARTIFACTS:
                return found
    return found


@bp.get("/runs/<run_id:run_id>")
@require_admin
def get_run(run_id: int):
    store = get_store()
    run = store.get_run(run_id)
    after = int_arg("after", 0)
    events = store.events(run_id, after=after, limit=MAX_EVENTS)
    paths = run_paths(get_config(), run_id)
    return jsonify({
        "run": _run_json(run),
        "events": [event_json(e) for e in events],
        "next_after": events[-1].seq if events else after,
        "more_events": len(events) == MAX_EVENTS,
        "artifacts": _artifacts(paths.artifacts),
        "has_predictions": paths.predictions.is_file(),
    })


@bp.post("/runs/<run_id:run_id>/cancel")
@require_admin
def cancel_run(run_id: int):
    config, store = get_config(), get_store()
    store.get_run(run_id)  # 404 for an unknown run
    by = queue.CANCELLED_FROM_PAGE if admin_via() == "session" else queue.CANCELLED_FROM_API
    run = queue.cancel_run(config, store, run_id, by=by)
    return jsonify({"run": _run_json(run)})


@bp.get("/runs/<run_id:run_id>/predictions")
@require_admin
def predictions(run_id: int):
    """A summary of the run's predictions: counts per schema and label, mean confidence, a sample."""
    get_store().get_run(run_id)
    path = run_paths(get_config(), run_id).predictions
    if not path.is_file():
        return jsonify({"available": False, "count": 0, "schemas": {}, "sample": []})
    labels: dict[str, Counter] = {}  # per schema: its predictions' labels (a set's each, a span's each)
    per_schema: dict[str, int] = {}
    confidence: dict[str, list[float]] = {}
    sample, count, unreadable = [], 0, 0
    with open(path, "rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                schema, shown = str(row["schema"]), _shown_answers(row)
            except (ValueError, KeyError, TypeError):
                unreadable += 1
                continue
            count += 1
            labels.setdefault(schema, Counter()).update(shown)
            per_schema[schema] = per_schema.get(schema, 0) + 1
            if isinstance(row.get("confidence"), (int, float)):
                stats = confidence.setdefault(schema, [0.0, 0])
                stats[0] += row["confidence"]
                stats[1] += 1
            if len(sample) < PREDICTION_SAMPLE:
                sample.append(row)
    schemas = {
        s: {"labels": dict(c.most_common()), "count": per_schema[s],
            "mean_confidence": (confidence[s][0] / confidence[s][1]) if confidence.get(s) else None}
        for s, c in sorted(labels.items())
    }
    return jsonify({"available": True, "count": count, "unreadable_lines": unreadable,
                    "schemas": schemas, "sample": sample})


def _shown_answers(row: dict[str, Any]) -> list[str]:
    """What a prediction counts under in the summary: its label (each of a set's), each span's label,
    or ``value``/``text`` for a number or a text. KeyError for a line with none of these."""
    if "label" in row:
        return [str(x) for x in row["label"]] if isinstance(row["label"], list) else [str(row["label"])]
    if "spans" in row:
        return [str(span["label"]) for span in row["spans"]]
    for field in ("value", "text"):
        if field in row:
            return [field]
    raise KeyError("label")


@bp.delete("/runs/<run_id:run_id>/predictions")
@require_admin
def retract_predictions(run_id: int):
    """Retract the run's predictions (``potato.results.retract``), as Potato 2.12.1's own route of this name does."""
    config, store = get_config(), get_store()
    try:
        result = retract(config, store, run_id)
    except RetractError as exc:
        raise ApiError(409, str(exc)) from None
    return jsonify({"run": _run_json(store.get_run(run_id)), **result.as_dict()})


PROMOTED_BY = {True: "by an admin on the Training page", False: "by a caller of the admin API"}


@bp.post("/runs/<run_id:run_id>/promote")
@require_admin
def promote_run(run_id: int):
    """Write the run's predictions back although the quality gate held them back (``potato.results.promote``)."""
    config, store = get_config(), get_store()
    try:
        summary, live = promote(config, store, run_id, by=PROMOTED_BY[admin_via() == "session"])
    except (PromoteError, WritebackError) as exc:
        raise ApiError(409, str(exc)) from None
    return jsonify({"run": _run_json(store.get_run(run_id)), "writeback": summary.describe(),
                    "live": live.describe() if live is not None else None})


@bp.put("/runs/<run_id:run_id>/pin")
@require_admin
def pin_run(run_id: int):
    """Pin the run (``{"pinned": true}``) or unpin it (``false``): a pinned run's predictions stay with annotators."""
    body = json_body()
    if not isinstance(body.get("pinned"), bool):
        raise ApiError(400, 'The body must be {"pinned": true} or {"pinned": false}')
    config, store = get_config(), get_store()
    try:
        message = pin(config, store, run_id, body["pinned"])
    except PromoteError as exc:
        raise ApiError(409, str(exc)) from None
    return jsonify({"run": _run_json(store.get_run(run_id)), "message": message})


@bp.get("/writeback")
@require_admin
def writeback():
    """What annotators see: the newest written-back run's report (items pre-filled, held back per rule, the
    least certain unlabelled items)."""
    return jsonify(writeback_json(get_config(), get_store()))


@bp.get("/runs/<run_id:run_id>/evaluation")
@require_admin
def evaluation(run_id: int):
    """The run's holdout evaluation (``potato.results.evaluation``): per schema the confusion matrix and reliability bins."""
    get_store().get_run(run_id)
    found = read_evaluation(run_paths(get_config(), run_id).dir)
    if found is None:
        return jsonify({"available": False, "schemas": {}})
    return jsonify({"available": True, "schemas": found.get("schemas", {})})


@bp.get("/compare")
@require_admin
def compare_runs():
    """Runs side by side (``potato.run_comparison``): ``?runs=7,9``."""
    try:
        return jsonify(compare(get_config(), get_store(), parse_runs(request.args.get("runs"))).as_dict())
    except CompareError as exc:
        raise ApiError(400, str(exc)) from None


@bp.get("/backends")
@require_admin
def list_backends():
    config = get_config()
    return jsonify({"backends": backends_json(config), "default": config.model_training.backend or "local"})


@bp.post("/backends/<name>/check")
@require_admin
def check(name: str):
    config = get_config()
    if name not in config.model_training.backends:
        unknown = UnknownBackendError(name, config.model_training.backends)
        raise ApiError(404, str(unknown), known_backends=unknown.known)
    report = check_backend(config, name)
    return jsonify(report.as_dict())


@bp.get("/auto-retrain")
@require_admin
def auto_retrain():
    """What the auto-retrain watcher's last check found, and why it did not queue a run."""
    return jsonify(current_app.extensions["potato.background"].watcher.status())


@bp.get("/trainers")
@require_admin
def trainers():
    """Every trainer, what it trains and whether this server has its packages (Potato 2.12.1's shape, and more)."""
    config = get_config()
    return jsonify({
        "trainers": trainers_json(), "default": None, "default_by_kind": DEFAULT_BY_KIND,
        "schemas": [s.name for s in config.schemes],
        "default_schemas": default_schemas(config),
    })


@bp.get("/schemas")
@require_admin
def schemas():
    """Each schema of the project with the trainers that can train it (Potato 2.12.1's shape)."""
    return jsonify({"schemas": schemas_json(get_config())})
