"""The agent protocol's routes (``/training/agent/v1``): claim a job, fetch its bundle, report back.

Documented for people who write their own agent in docs/agent-protocol.md;
keep the two in step. Views are thin: ``callers`` says who may do what,
``bodies`` checks what was sent, ``potato.runs.run_events`` records events,
``predictions`` takes the upload. Each view that takes a body declares its
check with ``admits``, so a refused body is never read.

Every accepted request is a sign of life: it updates the run's heartbeat and
the backend token's ``last_seen`` (each written at most once a second, so a
busy agent does not turn every request into two writes).
"""

from __future__ import annotations

import errno
import hashlib
import json
from pathlib import Path
from typing import Any

from flask import Blueprint, jsonify, request, send_file

from potato.bundle.pack import pack_bundle
from potato.errors import DiskFull
from potato.protocol import bodies, prediction_upload
from potato.protocol.callers import admit_claim, admit_run, agent_state, authorize_run, claimant, config, store
from potato.protocol.jsonapi import ApiError, admits, json_body
from potato.protocol.state import CLAIMED, display_state
from potato.runs import run_events
from potato.runs.jobs import make_job
from potato.runs.paths import RunPaths, run_paths
from potato.runs.runlog import RunLog
from potato.runs.store import RUNNING, Run
from potato.training import atomic_files, job_paths
from potato.training.agent_protocol import MAX_EVENTS_PER_BATCH, POLL_INTERVAL_S, PREFIX, PROTOCOL_VERSION

bp = Blueprint("agent_protocol", __name__, url_prefix=PREFIX)


# -- claiming -------------------------------------------------------------------------------------


def _paths(run_id: int) -> RunPaths:
    return run_paths(config(), run_id)


def _ensure_bundle(run_id: int) -> Path | None:
    """The run's ``bundle.tar.gz``, packed from ``bundle/`` if the flow has not packed it; None if not built yet."""
    paths = _paths(run_id)
    if paths.bundle_archive.is_file():
        return paths.bundle_archive
    if not (paths.bundle / "manifest.json").is_file():  # manifest.json is written last
        return None
    return pack_bundle(paths.bundle, paths.bundle_archive)


def _sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime)
    sums = agent_state().bundle_sums
    if key not in sums:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        sums[key] = digest.hexdigest()
    return sums[key]


def _job(run: Run) -> dict[str, Any]:
    """What a claim answers: the run, its limits, where its bundle is, and job.json."""
    mt = config().model_training
    bundle = _paths(run.id).bundle_archive
    spec = make_job(config(), run, bundle=job_paths.BUNDLE)
    return {
        "run_id": run.id,
        "backend": run.backend,
        "trainer": run.trainer,
        "schemas": list(run.schemas),
        "options": spec.get("options", {}),
        "grace_seconds": mt.grace_seconds,
        "heartbeat_timeout_s": mt.heartbeat_timeout(run.backend),
        "max_predictions_mb": mt.max_predictions_mb,
        "bundle_url": f"{PREFIX}/runs/{run.id}/{job_paths.BUNDLE_ARCHIVE}",
        "bundle_bytes": bundle.stat().st_size,
        "bundle_sha256": _sha256(bundle),
        "urls": {
            "status": f"{PREFIX}/runs/{run.id}",
            "events": f"{PREFIX}/runs/{run.id}/events",
            "predictions": f"{PREFIX}/runs/{run.id}/predictions",
            "result": f"{PREFIX}/runs/{run.id}/result",
        },
        "job": spec,
    }


def _answer(job: dict[str, Any] | None):
    return jsonify({"job": job, "poll_interval_s": POLL_INTERVAL_S, "protocol": PROTOCOL_VERSION})


def _mark_claimed(run: Run, info: dict[str, Any]) -> None:
    store().add_event(run.id, CLAIMED, info)
    agent_state().claimed.add(run.id)
    agent_state().heartbeat(store(), run.id, force=True)


@bp.post("/backends/<name>/claim")
@admits(admit_claim)
def claim(name: str):
    """Give the caller the next job of its backend, or ``{"job": null}`` when there is none."""
    caller = claimant(name)
    if caller.run_id is None:
        agent_state().touch_token(store(), caller.backend)
    body = json_body() if request.content_length else {}
    try:
        info = {"address": request.remote_addr, **bodies.check_agent_info(body)}
    except bodies.BadField as exc:
        raise ApiError(400, str(exc)) from None
    state = agent_state()
    if caller.run_id is not None:
        # The agent of an ssh or slurm run: its job is its run.
        run = store().get_run(caller.run_id)
        if run.state != RUNNING or _ensure_bundle(run.id) is None:
            return _answer(None)
        with state.lock:
            if not state.is_claimed(store(), run):
                _mark_claimed(run, info)
        return _answer(_job(run))
    with state.lock:
        for run in store().active_runs():
            if run.backend != name or run.state != RUNNING or run.cancel_requested_at:
                continue
            if state.is_claimed(store(), run) or _ensure_bundle(run.id) is None:
                continue
            _mark_claimed(run, info)
            where = info.get("host") or request.remote_addr
            store().update_run(run.id, step=f"the agent on {where} claimed the run; it downloads the bundle")
            return _answer(_job(store().get_run(run.id)))
    return _answer(None)


# -- one run's routes --------------------------------------------------------------------------------


def _status(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.id,
        "state": display_state(config(), run, claimed=True),
        "cancel": bool(run.cancel_requested_at),
    }


@bp.get("/runs/<run_id:run_id>")
def status(run_id: int):
    """The run's state and whether the agent should stop (``cancel``)."""
    run, _ = authorize_run(run_id)
    agent_state().heartbeat(store(), run.id)
    return jsonify(_status(run))


@bp.get("/runs/<run_id:run_id>/bundle.tar.gz")
def bundle(run_id: int):
    """The run's bundle; answers ``Range`` requests (206), so a cut download resumes."""
    run, _ = authorize_run(run_id)
    path = _ensure_bundle(run.id)
    if path is None:
        raise ApiError(404, f"Run {run_id}'s bundle is not built yet; claim the run again in a moment")
    agent_state().heartbeat(store(), run.id)
    return send_file(path, mimetype="application/gzip", as_attachment=True,
                     download_name=f"run-{run_id}-bundle.tar.gz", conditional=True, etag=True, max_age=0)


def _bad_event(index: int, event: Any, problem: str, run_id: int) -> ApiError:
    seq = bodies.event_seq(event)
    stored = store().get_run(run_id).last_seq
    named = f"events[{index}] (seq {seq})" if seq is not None else f"events[{index}]"
    return ApiError(400, f"{named}: {problem}. The events before it are stored (last_seq {stored}); "
                    "send the ones after it again", seq=seq, last_seq=stored)


@bp.post("/runs/<run_id:run_id>/events")
@admits(admit_run)
def post_events(run_id: int):
    """Record a batch of worker events; the answer says ``cancel: true`` when the agent should stop.

    Events are checked and recorded one by one, in order: the first bad one
    is answered 400 naming it, and the ones before it stay recorded.
    """
    run, _ = authorize_run(run_id)
    body = json_body()
    events = body.get("events")
    if not isinstance(events, list):
        raise ApiError(400, "The body must be {\"events\": [...]}, a list of worker events "
                       "(docs/architecture.md, \"The job directory\")", last_seq=run.last_seq)
    if len(events) > MAX_EVENTS_PER_BATCH:
        raise ApiError(400, f"A batch holds at most {MAX_EVENTS_PER_BATCH} events; this one has "
                       f"{len(events)}; send them in several batches", last_seq=run.last_seq)
    log = RunLog(store(), run.id, _paths(run.id).run_log, mirror_to_prefect=False)
    accepted = 0
    for index, event in enumerate(events):
        try:
            bodies.check_event(event)
        except bodies.BadField as exc:
            raise _bad_event(index, event, str(exc), run.id) from None
        accepted += run_events.record(store(), run.id, log, event)
    agent_state().heartbeat(store(), run.id)  # an empty batch is a heartbeat too
    run = store().get_run(run.id)
    return jsonify({**_status(run), "accepted": accepted, "last_seq": run.last_seq})


def _admit_predictions(run_id: int, **_: object) -> None:
    admit_run(run_id)
    limit_mb = config().model_training.max_predictions_mb
    size = request.content_length
    if size is not None and size > limit_mb * 1024 * 1024:
        raise prediction_upload.too_large(limit_mb, size)


@bp.route("/runs/<run_id:run_id>/predictions", methods=["PUT", "POST"])
@admits(_admit_predictions, upload=True)
def upload_predictions(run_id: int):
    """Stream the run's ``predictions.jsonl`` into its run directory; 413 over ``max_predictions_mb``."""
    run, _ = authorize_run(run_id)
    limit_mb = config().model_training.max_predictions_mb
    request.max_content_length = limit_mb * 1024 * 1024  # this route's own limit, not MAX_CONTENT_LENGTH
    paths = _paths(run.id)
    paths.dir.mkdir(parents=True, exist_ok=True)
    try:
        total, lines = prediction_upload.receive(request.stream, paths, limit_mb=limit_mb, expected=request.content_length)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        # Not transient for the agent (it would retry until its offline limit): it reports the run failed.
        raise ApiError(507, str(DiskFull(paths.dir))) from None
    agent_state().heartbeat(store(), run.id, force=True)
    return jsonify({"run_id": run.id, "bytes": total, "lines": lines})


@bp.post("/runs/<run_id:run_id>/result")
@admits(admit_run)
def result(run_id: int):
    """Record how the worker ended: exit code, holdout scores, where the model stays."""
    run, _ = authorize_run(run_id)
    try:
        report = bodies.check_result(json_body())
    except bodies.BadField as exc:
        raise ApiError(400, str(exc)) from None
    code, scores, uri = report["exit_code"], report["scores"], report["artifact_uri"]
    paths = _paths(run.id)
    paths.dir.mkdir(parents=True, exist_ok=True)
    before = paths.read_exit_code()
    if before is not None:
        if before == code:
            return jsonify({**_status(run), "recorded": False, "already_recorded": True})
        raise ApiError(409, f"Run {run_id}'s result was already reported (exit code {before})")
    fields: dict[str, Any] = {}
    if scores is not None:
        fields["scores"] = scores
    if uri is not None:
        fields["artifact_uri"] = uri
    # Stored only while the run is running, checked in the same transaction (RunEnded: 409).
    store().record_worker_event(run.id, None, "result", {"exit_code": code, "error": report["error"],
                                                         "artifact_uri": uri}, **fields)
    if scores is not None:
        atomic_files.write_text(paths.scores, json.dumps(scores, indent=2))
    atomic_files.write_text(paths.exit_code, f"{code}\n")  # last: the flow takes the run as reported once it exists
    return jsonify({**_status(store().get_run(run.id)), "recorded": True})

