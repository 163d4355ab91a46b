"""What agents send, checked field by field where it enters: events, results, scores, claims, predictions.

An agent is another machine's program (ours, or one a user wrote from
docs/agent-protocol.md), so nothing it sends is trusted: every field the
server uses has a declared type and bounds here, and a value outside them
is refused with a sentence naming the field, the value and what to send.
Unknown extra fields of an event are kept (a newer worker may add some); the
body's strict JSON (no NaN, bounded nesting) is already checked by
``potato.jsonapi``.

The checks are pure: they raise ``BadField`` and the routes turn it into the
400 their callers expect (an event's answer names ``events[i]`` and its seq).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Mapping

from potato.answer_kinds import KINDS
from potato.jsonapi import ApiError, parse_json
from potato.store import MAX_RUN_ID

EVENT_TYPES = ("started", "log", "progress", "metrics", "done")
LOG_LEVELS = ("info", "warning", "error")
MAX_NAME_CHARS = 300           # a device, a Python version, a schema, a host: one cell of a table
MAX_MESSAGE_CHARS = 64 * 1024  # a log line or an error: a traceback fits
MAX_PATH_CHARS = 2000          # a directory, an artifact_uri
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class BadField(ValueError):
    """A field an agent sent is missing or wrong; the message names it and says what to send."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- value kinds: each returns None when the value is fine, else what to send instead ----------


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(minimum: int, maximum: int = MAX_RUN_ID) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= maximum:
            return None
        if maximum == MAX_RUN_ID:
            return f"a whole number of at least {minimum}"
        return f"a whole number from {minimum} to {maximum}"
    return check


def _number(minimum: float = -math.inf, maximum: float = math.inf) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if _is_number(value) and minimum <= value <= maximum:
            return None
        if math.isinf(minimum):
            return "a number"
        return f"a number of at least {minimum:g}" if math.isinf(maximum) else f"a number from {minimum:g} to {maximum:g}"
    return check


def _line(max_chars: int) -> Callable[[Any], str | None]:
    """A string of one line (a newline in it would forge a line of the run log)."""
    def check(value: Any) -> str | None:
        if isinstance(value, str) and len(value) <= max_chars and not _CONTROL.search(value):
            return None
        return f"a string of at most {max_chars} characters without control characters"
    return check


_name = _line(MAX_NAME_CHARS)
_path = _line(MAX_PATH_CHARS)


def _message(value: Any) -> str | None:
    if isinstance(value, str) and len(value) <= MAX_MESSAGE_CHARS and not _CONTROL_BUT_LINES.search(value):
        return None
    return f"a string of at most {MAX_MESSAGE_CHARS} characters (lines and tabs allowed, no other control characters)"


def _names(value: Any) -> str | None:
    if isinstance(value, list) and len(value) <= 100 and all(_name(v) is None for v in value):
        return None
    return "a list of schema names"


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else "one of: " + ", ".join(choices)
    return check


# -- events -----------------------------------------------------------------------------------

# type -> {field: (check, required)}; every optional field may also be null (= absent).
_EVENT_FIELDS: Mapping[str, Mapping[str, tuple[Callable[[Any], str | None], bool]]] = {
    "started": {"pid": (_whole(0), False), "python": (_name, False), "device": (_name, False),
                "device_name": (_name, False), "trainer": (_name, False), "schemas": (_names, False)},
    "log": {"level": (_one_of(*LOG_LEVELS), False), "message": (_message, True)},
    "progress": {"phase": (_one_of("train", "predict"), False), "step": (_whole(0), False),
                 "total": (_whole(0), False), "epoch": (_number(0), False), "loss": (_number(), False),
                 "schema": (_name, False)},
    "metrics": {},  # its scores: check_scores
    "done": {"status": (_one_of("succeeded", "failed", "cancelled"), True), "error": (_message, False)},
}
# Without a seq: an agent's own note for the run log (Potato's agent sends its SLURM notes so),
# stored each time it comes; the worker's events all have one.
_COMMON_FIELDS = {"seq": (_whole(1), False), "t": (_number(0), False)}


def _check_fields(record: Mapping[str, Any], fields: Mapping[str, tuple[Callable[[Any], str | None], bool]]) -> None:
    for name, (check, required) in fields.items():
        value = record.get(name)
        if value is None:
            if required:
                raise BadField(f"{name} is missing")
            continue
        use = check(value)
        if use is not None:
            raise BadField(f"{name} is {_show(value)}; use {use}")


def event_seq(event: Any) -> int | None:
    """The event's seq if it has a valid one (for naming it in an answer), else None."""
    seq = event.get("seq") if isinstance(event, dict) else None
    return seq if _whole(1)(seq) is None else None


def check_event(event: Any) -> dict[str, Any]:
    """A worker event (docs/architecture.md, "The job directory"), or ``BadField``."""
    if not isinstance(event, dict):
        raise BadField(f"{_show(event)} is not a JSON object; each event is one")
    kind = event.get("type")
    if kind not in EVENT_TYPES:
        raise BadField(f"type is {_show(kind)}; use one of: {', '.join(EVENT_TYPES)}")
    _check_fields(event, _COMMON_FIELDS)
    _check_fields(event, _EVENT_FIELDS[kind])
    if kind == "metrics":
        check_scores(event.get("scores"))
    return event


# -- scores and results -----------------------------------------------------------------------

# Each kind of answer has its own metrics (potato/trainers/metrics.py); any other key is a number or null.
_SCORE_FIELDS = {"kind": (_one_of(*KINDS), False), "accuracy": (_number(0, 1), False),
                 "macro_f1": (_number(0, 1), False), "n": (_whole(0), False)}


def check_scores(value: Any) -> dict[str, Any]:
    """Holdout scores ``{schema: {"accuracy", "macro_f1", "n"}}``, or ``BadField``."""
    shape = 'a JSON object {schema: {"accuracy": 0.9, "macro_f1": 0.89, "n": 48}}'
    if not isinstance(value, dict) or len(value) > 100:
        raise BadField(f"scores must be {shape}")
    for schema, score in value.items():
        if _name(schema) is not None:
            raise BadField(f"scores has a schema named {_show(schema)}; use {_name(schema)}")
        if not isinstance(score, dict):
            raise BadField(f"scores.{schema} is {_show(score)}; use {shape}")
        try:
            _check_fields(score, _SCORE_FIELDS)
        except BadField as exc:
            raise BadField(f"scores.{schema}.{exc}") from None
        for key, number in score.items():
            if key not in _SCORE_FIELDS and number is not None and not _is_number(number):
                raise BadField(f"scores.{schema}.{key} is {_show(number)}; use a number or null")
    return value


# exit_code: the worker's exit status, or minus the signal that killed it.
_RESULT_FIELDS = {"exit_code": (_whole(-255, 255), True), "artifact_uri": (_path, False), "error": (_message, False)}


def check_result(body: Mapping[str, Any]) -> dict[str, Any]:
    """A result report ``{"exit_code", "scores"?, "artifact_uri"?, "error"?}``, or ``BadField``."""
    _check_fields(body, _RESULT_FIELDS)
    if body.get("scores") is not None:
        check_scores(body["scores"])
    return {key: body.get(key) for key in ("exit_code", "scores", "artifact_uri", "error")}


# -- claims ---------------------------------------------------------------------------------------

_AGENT_INFO_FIELDS = {"host": (_name, False), "python": (_name, False), "version": (_name, False),
                      "workdir": (_path, False)}


def check_agent_info(body: Mapping[str, Any]) -> dict[str, str]:
    """A claim's optional ``{"agent": {"host", "python", "version", "workdir"}}``, or ``BadField``."""
    agent = body.get("agent")
    if agent is None:
        return {}
    if not isinstance(agent, dict):
        raise BadField(f"agent is {_show(agent)}; use a JSON object with host, python, version, workdir")
    try:
        _check_fields(agent, _AGENT_INFO_FIELDS)
    except BadField as exc:
        raise BadField(f"agent.{exc}") from None
    return {key: agent[key] for key in _AGENT_INFO_FIELDS if agent.get(key) is not None}


# -- predictions ----------------------------------------------------------------------------------

_PREDICTION_FIELDS = {"id": (lambda v: None if isinstance(v, (str, int)) and not isinstance(v, bool)
                             else "the item's id (a string or a whole number)", True),
                      "schema": (_name, True), "label": (_name, True), "confidence": (_number(0, 1), True)}


def check_prediction_line(line: bytes, number: int) -> None:
    """One line of ``predictions.jsonl``: ``{"id", "schema", "label", "confidence"}``, or ``BadField``."""
    try:
        record = parse_json(line, f"predictions.jsonl line {number}")
    except ApiError as exc:
        raise BadField(exc.message) from None
    if not isinstance(record, dict):
        raise BadField(f"predictions.jsonl line {number} is {_show(record)}; each line is a JSON object "
                       '{"id", "schema", "label", "confidence"}')
    try:
        _check_fields(record, _PREDICTION_FIELDS)
    except BadField as exc:
        raise BadField(f"predictions.jsonl line {number}: {exc}") from None
