"""One error handler for the whole app: every error is a JSON body with a status.

``{"error": "<a sentence naming the problem and the fix>", ...extra}``. No
HTML error pages and no tracebacks reach a client; unexpected exceptions are
logged with their traceback and answered 500 with a sentence that points at
the server log. (Blueprint handlers never see routing 404/405, so the
handlers are registered on the app: STYLE.md, "The Flask app".)
"""

from __future__ import annotations

import json
import logging
from typing import Any

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

from potato.errors import StoreError

log = logging.getLogger(__name__)


class ApiError(Exception):
    """A domain error with an HTTP status; ``extra`` goes into the JSON body."""

    def __init__(self, status: int, message: str, **extra: Any):
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra


# Sentences for the HTTP errors Werkzeug raises itself.
_HTTP_TEXT = {
    400: "The request is malformed",
    404: "There is nothing at this URL",
    405: "This URL does not accept the {method} method",
    413: "The request body is too large",
    415: "Send the body as JSON (Content-Type: application/json)",
}


def _body(status: int, message: str, **extra: Any):
    response = jsonify({"error": message, **extra})
    response.status_code = status
    return response


def init_app(app: Flask) -> None:
    """Register the JSON error handlers on *app*."""

    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError):
        return _body(exc.status, exc.message, **exc.extra)

    @app.errorhandler(StoreError)
    def _store_error(exc: StoreError):
        # get_run of an unknown id is the only StoreError a view lets through.
        return _body(404, str(exc))

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        from flask import request

        status = exc.code or 500
        text = _HTTP_TEXT.get(status, exc.name).format(method=request.method)
        if status == 413 and getattr(exc, "potato_limit", None):
            text = exc.potato_limit
        response = _body(status, text)
        if status == 405 and getattr(exc, "valid_methods", None):
            response.headers["Allow"] = ", ".join(exc.valid_methods)
        return response

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("Unhandled error in a request")
        return _body(500, "Internal error in the annotation server; the server log has the details")


def json_body(required: bool = True) -> dict[str, Any]:
    """The request's JSON object, or a 400/415 that says what is wrong with it."""
    if not request.data and not required:
        return {}
    if not request.is_json:
        raise ApiError(415, "Send the body as JSON with Content-Type: application/json")
    try:
        body = json.loads(request.get_data(cache=True) or b"null")
    except ValueError as exc:
        raise ApiError(400, f"The body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"The body must be a JSON object, not {type(body).__name__}")
    return body
