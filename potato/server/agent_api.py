"""The agent protocol (``/training/agent/v1``): claim a job, fetch its bundle, report back.

Documented for people who write their own agent in docs/agent-protocol.md;
keep the two in step. Every request carries ``Authorization: Bearer TOKEN``:
an agent backend's token (``potato training register``) or the run token the
server gave the agent of an ssh or slurm run (``potato.tokens``).

Every accepted request counts as a sign of life: it updates the run's
heartbeat and the backend token's ``last_seen`` (each written at most once a
second, so a busy agent does not turn every request into two writes).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from flask import Blueprint, current_app, jsonify, request, send_file
from werkzeug.exceptions import RequestEntityTooLarge

from potato import runs
from potato.config import BackendConfig
from potato.server import get_config, get_store
from potato.server.errors import ApiError, json_body
from potato.server.serialize import CLAIMED, display_state
from potato.store import END_STATES, RUNNING, Run, Store
from potato.tokens import backend_of_token, run_of_token, tokens_equal

bp = Blueprint("agent_api", __name__, url_prefix="/training/agent/v1")

PROTOCOL_VERSION = 1
POLL_INTERVAL_S = 1.0
MAX_EVENTS_PER_BATCH = 1000
# How often last_seen and the heartbeat are written at most (seconds).
TOUCH_INTERVAL_S = 1.0
UPLOAD_CHUNK = 256 * 1024
EVENT_TYPES = ("started", "log", "progress", "metrics", "done")
BAD_TOKEN = "Missing or invalid agent token: send Authorization: Bearer <token>"


class AgentState:
    """Per-app memory of the agent routes: claimed runs, accepted event seqs, write throttles."""

    def __init__(self) -> None:
        self.lock = threading.Lock()          # one claim at a time: two agents never get one run
        self.claimed: set[int] = set()
        self.last_seq: dict[int, int] = {}
        self.seq_lock = threading.Lock()
        self._touched: dict[str, float] = {}
        self._beats: dict[int, float] = {}
        self.bundle_sums: dict[tuple[str, int, float], str] = {}

    def is_claimed(self, store: Store, run: Run) -> bool:
        """Whether an agent has claimed *run* (its ``claimed`` event exists)."""
        if run.id in self.claimed:
            return True
        if any(e.kind == CLAIMED for e in store.events(run.id)):
            self.claimed.add(run.id)
            return True
        return False

    def touch_token(self, store: Store, backend: str) -> None:
        now = time.monotonic()
        if now - self._touched.get(backend, -1e9) >= TOUCH_INTERVAL_S:
            self._touched[backend] = now
            store.touch_token(backend)

    def heartbeat(self, store: Store, run_id: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._beats.get(run_id, -1e9) >= TOUCH_INTERVAL_S:
            self._beats[run_id] = now
            store.heartbeat(run_id)


def _state() -> AgentState:
    return current_app.extensions["potato.agent_state"]


def _bearer() -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 512:
        raise ApiError(401, BAD_TOKEN)
    return token


def _unauthorized() -> ApiError:
    return ApiError(401, BAD_TOKEN)


class _Caller:
    """Who a request is: the agents of backend ``backend`` (a backend token) or of run ``run_id``."""

    def __init__(self, backend: str, run_id: int | None = None):
        self.backend = backend
        self.run_id = run_id


def _identify(token: str) -> _Caller:
    """Which token *token* is; 401 when it is none this server issued (or the run ended)."""
    config, store = get_config(), get_store()
    backend = backend_of_token(config, store, token)
    if backend is not None:
        _state().touch_token(store, backend)
        return _Caller(backend)
    run = run_of_token(store, token, [r for r in store.active_runs()])
    if run is not None:
        return _Caller(run.backend, run.id)
    raise _unauthorized()


def _authorize_run(run_id: int) -> tuple[Run, _Caller]:
    """The run *run_id* if this request's token may act on it; 401/403/404 otherwise."""
    token = _bearer()
    store = get_store()
    try:
        run = store.get_run(run_id)
    except Exception:
        run = None
    if run is not None and run.run_token_hash and tokens_equal(token, run.run_token_hash):
        return run, _Caller(run.backend, run.id)
    caller = _identify(token)  # 401 for a token this server does not know
    if run is None:
        raise ApiError(404, f"No run with id {run_id}")
    if caller.run_id is not None:
        raise ApiError(403, f"This token is the token of run {caller.run_id}; it cannot act on run {run_id}")
    if caller.backend != run.backend:
        raise ApiError(403, f"This token is backend {caller.backend!r}'s; run {run_id} runs on "
                       f"backend {run.backend!r}")
    if not _state().is_claimed(store, run):
        raise ApiError(403, f"Run {run_id} has not been claimed by an agent; claim it first with "
                       f"POST {bp.url_prefix}/backends/{run.backend}/claim")
    return run, caller


def _heartbeat_timeout(backend: BackendConfig | None) -> float:
    mt = get_config().model_training
    value = backend.get("heartbeat_timeout_s") if backend is not None else None
    return float(value if value is not None else mt.heartbeat_timeout_s)


def _bundle_path(run_id: int) -> Path:
    return runs.run_dir(get_config(), run_id) / "bundle.tar.gz"


def _ensure_bundle(run_id: int) -> Path | None:
    """The run's ``bundle.tar.gz``, packed from ``bundle/`` if the flow has not packed it; None if not built yet."""
    path = _bundle_path(run_id)
    if path.is_file():
        return path
    bundle_dir = path.parent / "bundle"
    if not (bundle_dir / "manifest.json").is_file():  # manifest.json is written last
        return None
    from potato.project import pack_bundle

    return pack_bundle(bundle_dir, path)


def _sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime)
    sums = _state().bundle_sums
    if key not in sums:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        sums[key] = digest.hexdigest()
    return sums[key]


def _job(run: Run) -> dict[str, Any]:
    """What a claim answers: the run, its limits, where its bundle is, and job.json."""
    from potato.tasks.jobs import make_job

    config = get_config()
    backend = config.model_training.backends.get(run.backend)
    bundle = _bundle_path(run.id)
    spec = make_job(SimpleNamespace(config=config, run=run), bundle="bundle")
    return {
        "run_id": run.id,
        "backend": run.backend,
        "trainer": run.trainer,
        "schemas": list(run.schemas),
        "options": spec.get("options", {}),
        "grace_seconds": config.model_training.grace_seconds,
        "heartbeat_timeout_s": _heartbeat_timeout(backend),
        "max_predictions_mb": config.model_training.max_predictions_mb,
        "bundle_url": f"{bp.url_prefix}/runs/{run.id}/bundle.tar.gz",
        "bundle_bytes": bundle.stat().st_size,
        "bundle_sha256": _sha256(bundle),
        "urls": {
            "status": f"{bp.url_prefix}/runs/{run.id}",
            "events": f"{bp.url_prefix}/runs/{run.id}/events",
            "predictions": f"{bp.url_prefix}/runs/{run.id}/predictions",
            "result": f"{bp.url_prefix}/runs/{run.id}/result",
        },
        "job": spec,
    }


def _mark_claimed(run: Run, info: dict[str, Any]) -> None:
    store = get_store()
    store.add_event(run.id, CLAIMED, info)
    _state().claimed.add(run.id)
    _state().heartbeat(store, run.id, force=True)


def _agent_info(body: dict[str, Any]) -> dict[str, Any]:
    info: dict[str, Any] = {"address": request.remote_addr}
    agent = body.get("agent")
    if isinstance(agent, dict):
        for key in ("host", "python", "version", "workdir"):
            if isinstance(agent.get(key), (str, int, float)):
                info[key] = str(agent[key])[:300]
    return info


@bp.post("/backends/<name>/claim")
def claim(name: str):
    """Give the caller the next job of its backend, or ``{"job": null}`` when there is none."""
    token = _bearer()
    caller = _identify(token)
    body = json_body() if request.get_data(cache=True) else {}
    if caller.backend != name:
        raise ApiError(403, f"This token is backend {caller.backend!r}'s; it cannot claim jobs of "
                       f"backend {name!r}")
    store, state = get_store(), _state()
    idle = {"job": None, "poll_interval_s": POLL_INTERVAL_S, "protocol": PROTOCOL_VERSION}
    if caller.run_id is not None:
        # The agent of an ssh or slurm run: its job is its run.
        run = store.get_run(caller.run_id)
        if run.state != RUNNING or _ensure_bundle(run.id) is None:
            return jsonify(idle)
        if not state.is_claimed(store, run):
            with state.lock:
                if not state.is_claimed(store, run):
                    _mark_claimed(run, _agent_info(body))
        return jsonify({"job": _job(run), "poll_interval_s": POLL_INTERVAL_S, "protocol": PROTOCOL_VERSION})
    with state.lock:
        for run in store.active_runs():
            if run.backend != name or run.state != RUNNING or run.cancel_requested_at:
                continue
            if state.is_claimed(store, run) or _ensure_bundle(run.id) is None:
                continue
            _mark_claimed(run, _agent_info(body))
            where = _agent_info(body).get("host") or request.remote_addr
            store.update_run(run.id, step=f"the agent on {where} claimed the run; it downloads the bundle")
            return jsonify({"job": _job(store.get_run(run.id)), "poll_interval_s": POLL_INTERVAL_S,
                            "protocol": PROTOCOL_VERSION})
    return jsonify(idle)


def _status(run: Run) -> dict[str, Any]:
    ended = run.state in END_STATES
    return {
        "run_id": run.id,
        "state": display_state(get_config(), run, claimed=True),
        "cancel": bool(run.cancel_requested_at) or ended,
    }


@bp.get("/runs/<int:run_id>")
def status(run_id: int):
    """The run's state and whether the agent should stop (``cancel``)."""
    run, _ = _authorize_run(run_id)
    if run.state == RUNNING:
        _state().heartbeat(get_store(), run.id)
    return jsonify(_status(run))


@bp.get("/runs/<int:run_id>/bundle.tar.gz")
def bundle(run_id: int):
    """The run's bundle; answers ``Range`` requests (206), so a cut download resumes."""
    run, _ = _authorize_run(run_id)
    path = _ensure_bundle(run.id)
    if path is None:
        raise ApiError(404, f"Run {run_id}'s bundle is not built yet; claim the run again in a moment")
    if run.state == RUNNING:
        _state().heartbeat(get_store(), run.id)
    return send_file(path, mimetype="application/gzip", as_attachment=True,
                     download_name=f"run-{run_id}-bundle.tar.gz", conditional=True, etag=True, max_age=0)


def _check_event(i: int, event: Any) -> dict[str, Any]:
    if not isinstance(event, dict):
        raise ApiError(400, f"events[{i}] must be a JSON object, not {type(event).__name__}")
    kind = event.get("type")
    if kind not in EVENT_TYPES:
        raise ApiError(400, f"events[{i}].type is {kind!r}; use one of: {', '.join(EVENT_TYPES)}")
    seq = event.get("seq")
    if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or seq < 1):
        raise ApiError(400, f"events[{i}].seq is {seq!r}; use a whole number of at least 1")
    for key in ("step", "total", "epoch"):
        value = event.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise ApiError(400, f"events[{i}].{key} is {value!r}; use a number")
    loss = event.get("loss")
    if loss is not None and (not isinstance(loss, (int, float)) or isinstance(loss, bool)):
        raise ApiError(400, f"events[{i}].loss is {loss!r}; use a number")
    if kind == "metrics" and not isinstance(event.get("scores", {}), dict):
        raise ApiError(400, f"events[{i}].scores must be a JSON object")
    if kind == "log" and not isinstance(event.get("message", ""), str):
        raise ApiError(400, f"events[{i}].message must be a string")
    return event


@bp.post("/runs/<int:run_id>/events")
def post_events(run_id: int):
    """Store a batch of worker events; the answer says ``cancel: true`` when the agent should stop."""
    from potato.runlog import RunLog
    from potato.tasks.base import RunContext
    from potato.tasks.relay import record_event

    run, _ = _authorize_run(run_id)
    body = json_body()
    events = body.get("events")
    if not isinstance(events, list):
        raise ApiError(400, "The body must be {\"events\": [...]}, a list of worker events "
                       "(docs/architecture.md, \"The job directory\")")
    if len(events) > MAX_EVENTS_PER_BATCH:
        raise ApiError(400, f"A batch holds at most {MAX_EVENTS_PER_BATCH} events; this one has "
                       f"{len(events)}; send them in several batches")
    checked = [_check_event(i, e) for i, e in enumerate(events)]
    store, state, config = get_store(), _state(), get_config()
    if run.state != RUNNING:
        # Too late: the run ended (cancelled, timed out). Nothing is stored; the agent stops.
        return jsonify({**_status(run), "accepted": 0, "last_seq": state.last_seq.get(run.id, 0)})
    accepted = 0
    with state.seq_lock:
        last = state.last_seq.get(run.id, 0)
        fresh = []
        for event in checked:
            seq = event.get("seq")
            if isinstance(seq, int) and seq <= last:
                continue  # a retried batch: already stored
            fresh.append(event)
            if isinstance(seq, int):
                last = seq
        state.last_seq[run.id] = last
    if fresh:
        backend = config.model_training.backends.get(run.backend)
        path = runs.run_dir(config, run.id) / "run.log"
        ctx = RunContext(config, store, run, backend, RunLog(store, run.id, path, mirror_to_prefect=False))
        for event in fresh:
            record_event(ctx, event)
            accepted += 1
    state.heartbeat(store, run.id)  # record_event already beat for each stored event
    run = store.get_run(run.id)
    return jsonify({**_status(run), "accepted": accepted, "last_seq": state.last_seq.get(run.id, 0)})


def _too_large(limit_mb: int, size: int | None = None) -> ApiError:
    got = f" ({size / 1048576:.1f} MB)" if size is not None else ""
    return ApiError(413, f"predictions.jsonl is larger than model_training.max_predictions_mb "
                    f"({limit_mb} MB){got}; raise the limit in the config or predict fewer items",
                    max_predictions_mb=limit_mb)


@bp.route("/runs/<int:run_id>/predictions", methods=["PUT", "POST"])
def upload_predictions(run_id: int):
    """Stream the run's ``predictions.jsonl`` into its run directory; 413 over ``max_predictions_mb``."""
    run, _ = _authorize_run(run_id)
    config = get_config()
    limit_mb = config.model_training.max_predictions_mb
    limit = limit_mb * 1024 * 1024
    size = request.content_length
    if size is not None and size > limit:
        raise _too_large(limit_mb, size)  # refused before reading a byte
    if run.state in END_STATES:
        raise ApiError(409, f"Run {run_id} already ended ({run.state}); its predictions are not taken")
    request.max_content_length = limit  # this route's own limit, not MAX_CONTENT_LENGTH
    directory = runs.run_dir(config, run.id)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "predictions.jsonl"
    tmp = directory / f".predictions.jsonl.upload-{os.getpid()}-{threading.get_ident()}"
    total, lines = 0, 0
    try:
        with open(tmp, "wb") as out:
            stream = request.stream
            while True:
                try:
                    chunk = stream.read(UPLOAD_CHUNK)
                except RequestEntityTooLarge:  # Werkzeug's own count of the same limit
                    raise _too_large(limit_mb) from None
                if not chunk:
                    break
                total += len(chunk)
                if total > limit:  # no or a false Content-Length: count while streaming
                    raise _too_large(limit_mb)
                lines += chunk.count(b"\n")
                out.write(chunk)
        if size is not None and total != size:
            raise ApiError(400, f"The upload ended after {total} of {size} bytes; send it again")
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    _state().heartbeat(get_store(), run.id, force=True)
    return jsonify({"run_id": run.id, "bytes": total, "lines": lines})


@bp.post("/runs/<int:run_id>/result")
def result(run_id: int):
    """Record how the worker ended: exit code, holdout scores, where the model stays."""
    run, _ = _authorize_run(run_id)
    body = json_body()
    code = body.get("exit_code")
    if not isinstance(code, int) or isinstance(code, bool):
        raise ApiError(400, "exit_code must be a whole number (the worker's exit status)")
    scores = body.get("scores")
    if scores is not None and not isinstance(scores, dict):
        raise ApiError(400, "scores must be a JSON object: {schema: {accuracy, macro_f1, n}}")
    uri = body.get("artifact_uri")
    if uri is not None and (not isinstance(uri, str) or len(uri) > 2000):
        raise ApiError(400, "artifact_uri must be a string of at most 2000 characters")
    error = body.get("error")
    if error is not None and not isinstance(error, str):
        raise ApiError(400, "error must be a string")
    config, store = get_config(), get_store()
    directory = runs.run_dir(config, run.id)
    directory.mkdir(parents=True, exist_ok=True)
    code_file = directory / "exit_code"
    if code_file.is_file():
        before = code_file.read_text(encoding="utf-8").strip()
        if before == str(code):
            return jsonify({**_status(run), "recorded": False, "already_recorded": True})
        raise ApiError(409, f"Run {run_id}'s result was already reported (exit code {before})")
    if scores is not None:
        _write_atomic(directory / "scores.json", json.dumps(scores, indent=2))
    fields: dict[str, Any] = {}
    if scores is not None:
        fields["scores"] = scores
    if uri is not None:
        fields["artifact_uri"] = uri
    if fields:
        store.update_run(run.id, **fields)
    store.add_event(run.id, "result", {"exit_code": code, "error": error, "artifact_uri": uri})
    _write_atomic(code_file, f"{code}\n")
    _state().heartbeat(store, run.id, force=True)
    return jsonify({**_status(store.get_run(run.id)), "recorded": True})


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
