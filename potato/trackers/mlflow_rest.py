"""Report a run to an MLflow tracking server through its REST API: no MLflow package on the annotation server.

MLflow's own conventions, read from the server's environment:
``MLFLOW_TRACKING_URI`` (an ``http(s)://`` tracking server), the experiment
``MLFLOW_EXPERIMENT_NAME`` (default: the project's name, created when
missing), and its credentials ``MLFLOW_TRACKING_TOKEN`` (a bearer token) or
``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``, and
``MLFLOW_TRACKING_INSECURE_TLS``; ``HF_MLFLOW_LOG_ARTIFACTS`` (``1``/``true``)
adds the run's model files under ``model/``, as transformers' integration does. The credentials go only into the requests'
``Authorization`` header: never into a message, the run log or the store;
an address's ``user:password@`` is dropped from what is shown.

One MLflow run per training run, named ``run-N`` and tagged with the run id
and project: the options and counts as params, each training step's numbers
as metrics at their step and wall time, the holdout scores (per schema and
per label) once, the learning curve with the number of training items as
its step, and the files as artifacts (``mlflow server`` serves artifacts by
default; one that does not is told so). ``log-batch`` takes at most 1 000
metrics and 100 params a request: larger runs go in several.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Sequence

from potato.errors import TrackerError
from potato.trackers.tracked_run import TrackedRun

TIMEOUT_S = 30
METRICS_PER_BATCH, PARAMS_PER_BATCH = 1000, 100
# MLflow keeps param values up to this many characters.
PARAM_CHARS = 6000
UPLOADS_AT_ONCE = 4


def _shown(uri: str) -> str:
    parts = urllib.parse.urlsplit(uri)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


class TrackingServer:
    """The few REST calls a run needs, with the environment's credentials."""

    def __init__(self, env: dict[str, str]):
        uri = (env.get("MLFLOW_TRACKING_URI") or "").strip().rstrip("/")
        if not uri:
            raise TrackerError("MLFLOW_TRACKING_URI is not set in the annotation server's environment: set it to "
                               "your tracking server's address, e.g. http://mlflow.example.org:5000")
        parts = urllib.parse.urlsplit(uri)
        if parts.scheme not in ("http", "https"):
            raise TrackerError(f"MLFLOW_TRACKING_URI is {_shown(uri)!r}: the annotation server reports to a "
                               "tracking server over http(s) (run `mlflow server` and give its address)")
        self.uri, self.shown = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])), \
            _shown(uri)
        self.headers = {"Content-Type": "application/json"}
        user, _, password = parts.netloc.rpartition("@")[0].partition(":")
        token = env.get("MLFLOW_TRACKING_TOKEN")
        user, password = env.get("MLFLOW_TRACKING_USERNAME") or urllib.parse.unquote(user), \
            env.get("MLFLOW_TRACKING_PASSWORD") or urllib.parse.unquote(password)
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        elif user:
            self.headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        insecure = (env.get("MLFLOW_TRACKING_INSECURE_TLS") or "").lower() in ("1", "true")
        self.tls = ssl._create_unverified_context() if insecure else None  # noqa: S323 (the user asked for it)

    def call(self, method: str, path: str, body: Any = None, data: bytes | Path | None = None,
             content_type: str | None = None) -> dict[str, Any]:
        headers = dict(self.headers, **({"Content-Type": content_type} if content_type else {}))
        payload = data if data is not None else (json.dumps(body).encode() if body is not None else None)
        try:
            if isinstance(payload, Path):  # a model file goes up as it is read, never whole in memory
                headers["Content-Length"] = str(payload.stat().st_size)
                with payload.open("rb") as stream:
                    raw = self._send(urllib.request.Request(self.uri + path, data=stream, method=method,
                                                            headers=headers))
            else:
                raw = self._send(urllib.request.Request(self.uri + path, data=payload, method=method,
                                                        headers=headers))
        except urllib.error.HTTPError as exc:
            raise TrackerError(self._refusal(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TrackerError(f"the MLflow tracking server at {self.shown} did not answer ({reason}); is it "
                               "running, and is MLFLOW_TRACKING_URI its address?") from None
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise TrackerError(f"{self.shown} answered {path} with something that is not JSON: is "
                               "MLFLOW_TRACKING_URI an MLflow tracking server?") from None

    def _send(self, request: urllib.request.Request) -> bytes:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self.tls) as answer:
            return answer.read()

    def _refusal(self, exc: urllib.error.HTTPError) -> str:
        try:
            message = json.loads(exc.read() or b"{}").get("message") or ""
        except ValueError:
            message = ""
        if exc.code in (401, 403):
            return (f"the MLflow tracking server at {self.shown} refused the credentials ({exc.code}): set "
                    "MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")
        return f"the MLflow tracking server at {self.shown} answered {exc.code}" + (f": {message}" if message else "")


def _experiment(client: TrackingServer, name: str) -> str:
    query = urllib.parse.urlencode({"experiment_name": name})
    try:
        return _field(client.call("GET", f"/api/2.0/mlflow/experiments/get-by-name?{query}"), "experiment",
                      "experiment_id")
    except TrackerError as exc:
        if " answered 404" not in str(exc):
            raise
    return _field(client.call("POST", "/api/2.0/mlflow/experiments/create", {"name": name}), "experiment_id")


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _field(answer: dict[str, Any], *path: str) -> str:
    """``answer[path[0]][path[1]]…`` as a string: what the tracking server must have answered, else said so."""
    found: Any = answer
    for key in path:
        found = found.get(key) if isinstance(found, dict) else None
    if not isinstance(found, str) or not found or len(found) > 1000:
        raise TrackerError(f"the tracking server's answer has no {'.'.join(path)}: is MLFLOW_TRACKING_URI an MLflow "
                           "tracking server?")
    return found


def model_files(run: TrackedRun, env: dict[str, str]) -> dict[str, Path]:
    """``model/<path>`` -> file, for each of the run's model files where ``HF_MLFLOW_LOG_ARTIFACTS`` asks."""
    if run.model_dir is None or (env.get("HF_MLFLOW_LOG_ARTIFACTS") or "").strip().lower() not in ("1", "true"):
        return {}
    return {f"model/{path.relative_to(run.model_dir).as_posix()}": path
            for path in sorted(run.model_dir.rglob("*")) if path.is_file() and not path.is_symlink()}


def report(run: TrackedRun, env: dict[str, str] | None = None) -> str:
    """Log *run* as one MLflow run; return the line the run log keeps (where it went)."""
    env = dict(os.environ) if env is None else env
    client = TrackingServer(env)
    experiment = env.get("MLFLOW_EXPERIMENT_NAME") or run.project
    experiment_id = _experiment(client, experiment)
    info = client.call("POST", "/api/2.0/mlflow/runs/create", {
        "experiment_id": experiment_id, "run_name": run.name, "start_time": _ms(run.started_at),
        "tags": [{"key": "mlflow.runName", "value": run.name}, {"key": "potato.run_id", "value": str(run.run_id)},
                 {"key": "potato.project", "value": run.project}]})
    run_id = _field(info, "run", "info", "run_id")
    info = info["run"]["info"]
    now = _ms(time.time())
    metrics = [{"key": k, "value": v, "step": s.step, "timestamp": _ms(s.t)} for s in run.steps
               for k, v in s.values.items()]
    metrics += [{"key": k, "value": v, "step": 0, "timestamp": now} for k, v in run.scores.items()]
    metrics += [{"key": k, "value": v, "step": items, "timestamp": now} for k, items, v in run.curve]
    params = [{"key": k, "value": v[:PARAM_CHARS]} for k, v in run.params.items()]
    for batch in _chunks(params, PARAMS_PER_BATCH):
        client.call("POST", "/api/2.0/mlflow/runs/log-batch", {"run_id": run_id, "params": list(batch)})
    for batch in _chunks(metrics, METRICS_PER_BATCH):
        client.call("POST", "/api/2.0/mlflow/runs/log-batch", {"run_id": run_id, "metrics": list(batch)})
    files: dict[str, bytes | Path] = {**run.files, **model_files(run, env)}
    try:
        _upload(client, str(info.get("artifact_uri") or ""), files)
    finally:  # the numbers are in: the run is finished whether or not its files could follow
        client.call("POST", "/api/2.0/mlflow/runs/update", {"run_id": run_id, "status": "FINISHED",
                                                             "end_time": now})
    return (f"MLflow: run {run_id} of experiment {experiment!r} at {client.shown} ({len(metrics)} metrics, "
            f"{len(params)} params, {len(files)} files)")


def _upload(client: TrackingServer, artifact_uri: str, files: dict[str, bytes | Path]) -> None:
    prefix = "mlflow-artifacts:/"
    if not artifact_uri.startswith(prefix):
        raise TrackerError(f"the MLflow tracking server at {client.shown} stores artifacts at {artifact_uri!r}, "
                           "which the annotation server cannot write to: start it with --serve-artifacts (the "
                           "default of `mlflow server`) so that it takes them itself")
    base = "/api/2.0/mlflow-artifacts/artifacts/" + urllib.parse.quote(artifact_uri[len(prefix):].lstrip("/"))
    # A request at a time would wait on the server's store once per file: the files go up side by side.
    with ThreadPoolExecutor(max_workers=UPLOADS_AT_ONCE) as pool:
        for done in [pool.submit(client.call, "PUT", f"{base}/{urllib.parse.quote(name)}", data=data,
                                 content_type="application/octet-stream") for name, data in files.items()]:
            done.result()
