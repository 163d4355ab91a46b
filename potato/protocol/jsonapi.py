"""JSON over HTTP, the same for both of Potato's Flask apps (``potato start`` and an ssh run's socket).

Everything that enters through a request is checked here or by the view,
before it can reach the store or a file:

- **Every error is a JSON body** ``{"error": "<sentence naming the problem and
  the fix>", ...extra}`` with a status. No HTML error pages and no tracebacks
  reach a client; unexpected exceptions are logged with their traceback and
  answered 500 with a sentence that points at the server log. The store's
  refusals map by kind: an unknown run is 404, a run that already ended 409,
  a busy store 503 with ``Retry-After`` (an agent retries that; a 404 would
  make it stop its worker). Handlers sit on the app, not a blueprint, because
  blueprints never see routing 404/405 (STYLE.md, "The Flask app").
- **Bodies are strict JSON.** ``NaN`` and ``Infinity`` (which Python's json
  reads and every browser's ``JSON.parse`` rejects) are refused with a 400
  that names where they are, e.g. ``events[3].loss``, as is nesting deeper
  than ``MAX_DEPTH`` (Python's parser would die of RecursionError first).
- **A body is admitted before it is read.** ``admit_request`` runs before
  every view: the view's ``admits`` check (who is calling; may it send this
  here) and the size from ``Content-Length``, so a stranger or an oversized
  body is refused without a byte of it read. waitress buffers a whole body
  before it calls the app at all, so ``potato start`` also runs the same
  check from waitress's parser as soon as the headers are in
  (``refusal_before_body``; potato/server/commands.py).
- **Run ids in URLs** use the ``run_id`` converter: 1 to ``MAX_RUN_ID``;
  anything else is no run (404), never an OverflowError.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Callable

from flask import Flask, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import IntegerConverter

from potato.errors import RunEnded, StoreBusy, StoreError, UnknownRun
from potato.runs.store import MAX_RUN_ID

log = logging.getLogger(__name__)

# JSON bodies of the admin API and the agent protocol (an event batch of a
# thousand events is well under this); uploads set their own limit.
MAX_JSON_BYTES = 1024 * 1024
# The deepest legitimate body is an event batch's scores (5 levels); options
# nest a little more. Far below Python's recursion limit.
MAX_DEPTH = 20
RETRY_AFTER_S = 1


class ApiError(Exception):
    """A domain error with an HTTP status; ``extra`` goes into the JSON body."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.extra = extra


# Sentences for the HTTP errors Werkzeug raises itself.
_HTTP_TEXT = {
    400: "The request is malformed",
    404: "There is nothing at this URL",
    405: "This URL does not accept the {method} method",
    413: "The request body is too large",
    415: "Send the body as JSON (Content-Type: application/json)",
}


def error_response(status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> Response:
    response = jsonify({"error": message, **extra})
    response.status_code = status
    response.headers.update(headers or {})
    return response


class RunIdConverter(IntegerConverter):
    """``<run_id:run_id>``: a run id SQLite can hold; anything else matches no route (404)."""

    def __init__(self, map):
        super().__init__(map, min=1, max=MAX_RUN_ID)


def init_app(app: Flask) -> None:
    """The run-id converter, the before-body check and the JSON error handlers, on *app*.

    Call before registering blueprints (their rules use the converter).
    """
    app.url_map.converters["run_id"] = RunIdConverter
    app.before_request(admit_request)

    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError):
        return error_response(exc.status, exc.message, exc.headers, **exc.extra)

    @app.errorhandler(UnknownRun)
    def _unknown_run(exc: UnknownRun):
        return error_response(404, str(exc))

    @app.errorhandler(RunEnded)
    def _run_ended(exc: RunEnded):
        return error_response(409, str(exc), state=exc.state)

    @app.errorhandler(StoreBusy)
    def _store_busy(exc: StoreBusy):
        log.warning("Answered 503: %s", exc)
        return error_response(503, f"The run store is busy; try again in {RETRY_AFTER_S} s",
                              {"Retry-After": str(RETRY_AFTER_S)})

    @app.errorhandler(StoreError)
    def _store_error(exc: StoreError):
        log.error("The run store refused a request's change: %s", exc)
        return error_response(500, f"The run store refused the change: {exc}")

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        status = exc.code or 500
        text = _HTTP_TEXT.get(status, exc.name).format(method=request.method)
        response = error_response(status, text)
        if status == 405 and getattr(exc, "valid_methods", None):
            response.headers["Allow"] = ", ".join(exc.valid_methods)
        return response

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("Unhandled error in a request")
        return error_response(500, "Internal error in the annotation server; the server log has the details")


# -- admitting a body before reading it ---------------------------------------------------


def admits(check: Callable[..., None], *, upload: bool = False) -> Callable:
    """Mark a view: ``check(**view_args)`` decides, before any body byte is read, whether to take its body.

    *check* raises ``ApiError`` (401, 403, …) to refuse; it may only read
    headers and the store, never the body, and must not write (waitress runs
    it on its I/O thread). With *upload*, the view streams a body of its own
    limit, which *check* enforces from ``Content-Length``; otherwise the body
    is JSON of at most ``MAX_JSON_BYTES`` with a ``Content-Length``.
    """

    def mark(view: Callable) -> Callable:
        view.potato_admit = check
        view.potato_upload = upload
        return view

    return mark


def _has_body() -> bool:
    return bool(request.content_length) or "chunked" in request.headers.get("Transfer-Encoding", "").lower()


def admit_request() -> None:
    """Refuse the request's body, unread, if its view would refuse it (``before_request`` of both apps)."""
    if not _has_body():
        return
    if request.routing_exception is not None:
        raise request.routing_exception  # no view here: nothing takes the body
    view = current_app.view_functions.get(request.endpoint)
    check = getattr(view, "potato_admit", None)
    if check is not None:
        check(**(request.view_args or {}))
    if getattr(view, "potato_upload", False):
        return
    size = request.content_length
    if size is None:
        raise ApiError(411, "Send a JSON body with a Content-Length header (not Transfer-Encoding: chunked)")
    if size > MAX_JSON_BYTES:
        raise ApiError(413, f"The body is {size} bytes; a JSON body here may have at most {MAX_JSON_BYTES} bytes",
                       max_bytes=MAX_JSON_BYTES)


def refusal_before_body(app: Flask, environ: dict[str, Any]) -> Response | None:
    """The answer that refuses a request from its headers alone (*environ* has no body), or None to read it.

    For WSGI servers that buffer a body before calling the app: they call
    this when the headers are complete, and answer with the response instead
    of reading the body when it is not None.
    """
    with app.request_context(environ):
        try:
            admit_request()
        except Exception as exc:  # noqa: BLE001 - every refusal is answered through the app's handlers
            return app.make_response(app.handle_user_exception(exc))
    return None


# -- strict JSON ------------------------------------------------------------------------------


def parse_json(data: bytes | str, what: str = "The body") -> Any:
    """*data* as strict JSON: a 400 naming *what* for bad JSON, NaN/Infinity or too deep nesting."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise _too_deep(what) from None
    except ValueError as exc:
        raise ApiError(400, f"{what} is not valid JSON: {exc}") from None
    check_json_value(value, what)
    return value


def _too_deep(what: str) -> ApiError:
    return ApiError(400, f"{what} is nested more than {MAX_DEPTH} levels deep; no request here needs that")


def check_json_value(value: Any, what: str = "The body") -> None:
    """Raise a 400 naming the place of the first NaN/Infinity in *value*, or for nesting past ``MAX_DEPTH``."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _too_deep(what)
        if isinstance(item, float) and not math.isfinite(item):
            where = path.lstrip(".") or "the value"
            raise ApiError(400, f"{where} is {item} in {what[:1].lower()}{what[1:]}; JSON has no NaN or "
                           "Infinity: send a number or null", field=where)
        if isinstance(item, dict):
            stack.extend((v, f"{path}.{k}", depth + 1) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item))


def json_body() -> dict[str, Any]:
    """The request's body as a JSON object, or a 400/415 that says what is wrong with it."""
    if not request.is_json:
        raise ApiError(415, "Send the body as JSON with Content-Type: application/json")
    body = parse_json(request.get_data(cache=True) or b"null")
    if not isinstance(body, dict):
        raise ApiError(400, f"The body must be a JSON object, not {type(body).__name__}")
    return body
