"""What agents send, checked field by field where it enters: events, results, scores, claims, predictions.

An agent is another machine's program (ours, or one a user wrote from
docs/agent-protocol.md), so nothing it sends is trusted: every field the
server uses has a declared type and bounds here, and a value outside them
is refused with a sentence naming the field, the value and what to send.
Unknown extra fields of an event are kept (a newer worker may add some); the
body's strict JSON (no NaN, bounded nesting) is already checked by
``potato.protocol.jsonapi``.

The checks are pure: they raise ``BadField`` and the routes turn it into the
400 their callers expect (an event's answer names ``events[i]`` and its seq).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterator, Mapping

from potato.prefill.prediction_shapes import check_answer_fields
from potato.protocol.jsonapi import ApiError, parse_json
from potato.runs.store import MAX_RUN_ID
from potato.training.answer_kinds import KINDS

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
                 "schema": (_name, False), "trainer": (_name, False), "part": (_whole(1), False),
                 "parts": (_whole(1), False), "validation_loss": (_number(), False),
                 "validation_score": (_number(), False), "curve": (_number(0, 1), False),
                 "eta_s": (_number(0), False), "lr": (_number(0), False), "examples": (_whole(1), False)},
    "metrics": {},  # its scores: check_scores
    "done": {"status": (_one_of("succeeded", "failed", "cancelled"), True), "error": (_message, False)},
}
# Without a seq: an agent's own note for the run log (Potato's agent sends its SLURM notes so),
# stored each time it comes; the worker's events all have one.
_COMMON_FIELDS = {"seq": (_whole(1), False), "t": (_number(0), False)}


def _check_fields(record: Mapping[str, Any], fields: Mapping[str, tuple[Callable[[Any], str | None], bool]],
                  where: str = "") -> None:
    """Each of *fields* in *record*; a problem names the field after *where* (``"agent."``)."""
    for name, (check, required) in fields.items():
        value = record.get(name)
        if value is None:
            if required:
                raise BadField(f"{where}{name} is missing")
            continue
        use = check(value)
        if use is not None:
            raise BadField(f"{where}{name} is {_show(value)}; use {use}")


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

# Each kind's metrics (docs/answer-types.md, "In scores.json"), with their ranges; any other key a
# newer worker adds may be a number or null.
_SHARE = _number(0, 1)
_SCORE_FIELDS = {"kind": (_one_of(*KINDS), False), "n": (_whole(0), False),
                 "accuracy": (_SHARE, False), "macro_f1": (_SHARE, False), "micro_f1": (_SHARE, False),
                 "exact_match": (_SHARE, False), "precision": (_SHARE, False), "recall": (_SHARE, False),
                 "f1": (_SHARE, False), "mae": (_number(0), False), "spearman": (_number(-1, 1), False),
                 "chrf": (_number(0), False), "agreement": (_SHARE, False), "annotator_agreement": (_SHARE, False),
                 "best_agreement": (_SHARE, False), "worst_agreement": (_SHARE, False),
                 "kendall_tau": (_number(-1, 1), False), "top_agreement": (_SHARE, False),
                 "baseline_agreement": (_SHARE, False),
                 "decided": (_whole(0), False)}
_PER_LABEL_LIMIT = 1000


def _named_objects(value: Any, where: str, noun: str, shape: str, limit: int) -> Iterator[tuple[str, dict]]:
    """``(name, object)`` of a JSON object of at most *limit* names (a *noun* each: one line) to JSON objects."""
    if not isinstance(value, dict) or len(value) > limit:
        raise BadField(f"{where} must be {shape}")
    for name, inner in value.items():
        if _name(name) is not None:
            raise BadField(f"{where} has a {noun} named {_show(name)}; use {_name(name)}")
        if not isinstance(inner, dict):
            raise BadField(f"{where}.{name} is {_show(inner)}; use {shape}")
        yield name, inner


def check_scores(value: Any) -> dict[str, Any]:
    """Holdout scores ``{schema: {"kind", "n", …its kind's metrics}}``, or ``BadField``."""
    shape = 'a JSON object {schema: {"kind": "nominal", "accuracy": 0.9, "macro_f1": 0.89, "n": 48}}'
    for schema, score in _named_objects(value, "scores", "schema", shape, 100):
        try:
            _check_fields(score, _SCORE_FIELDS)
        except BadField as exc:
            raise BadField(f"scores.{schema}.{exc}") from None
        for key, number in score.items():
            if key == "per_label":
                for label, metrics in _named_objects(number, f"scores.{schema}.per_label", "label",
                                                     "a JSON object {label: {metric: number}}", _PER_LABEL_LIMIT):
                    for metric, x in metrics.items():
                        if _name(metric) is not None or (x is not None and not _is_number(x)):
                            raise BadField(f"scores.{schema}.per_label.{label}.{metric} is {_show(x)}; "
                                           "use a number or null")
            elif key == "curve":
                _check_curve(number, f"scores.{schema}.curve")
            elif key not in _SCORE_FIELDS and number is not None and not _is_number(number):
                raise BadField(f"scores.{schema}.{key} is {_show(number)}; use a number or null")
    return value


_CURVE_POINTS = 10
_CURVE_FIELDS = {"share": (_number(0, 1), True), "items": (_whole(0), True)}


def _check_curve(value: Any, where: str) -> None:
    """A learning curve: at most ``_CURVE_POINTS`` objects ``{"share", "items", <metric>: number or null}``."""
    shape = 'a list of at most {} objects {{"share": 0.25, "items": 40, "accuracy": 0.8}}'.format(_CURVE_POINTS)
    if not isinstance(value, list) or len(value) > _CURVE_POINTS:
        raise BadField(f"{where} must be {shape}")
    for n, point in enumerate(value):
        if not isinstance(point, dict) or len(point) > len(_CURVE_FIELDS) + 1:
            raise BadField(f"{where}[{n}] is {_show(point)}; use {shape}")
        _check_fields(point, _CURVE_FIELDS, f"{where}[{n}].")
        for key, x in point.items():
            if key not in _CURVE_FIELDS and (_name(key) is not None or (x is not None and not _is_number(x))):
                raise BadField(f"{where}[{n}].{key} is {_show(x)}; use a number or null")


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
    _check_fields(agent, _AGENT_INFO_FIELDS, "agent.")
    return {key: agent[key] for key in _AGENT_INFO_FIELDS if agent.get(key) is not None}


# -- predictions ----------------------------------------------------------------------------------

# Item ids are strings in the bundle (potato.bundle.build), so a prediction names its item by one.
_PREDICTION_FIELDS = {"id": (lambda v: None if isinstance(v, str) and v else "the item's id (a non-empty string)", True),
                      "schema": (_name, True)}


def prediction_problem(record: Mapping[str, Any]) -> str | None:
    """What is wrong with one prediction (a line of ``predictions.jsonl``, parsed), or None.

    The upload's rule, which knows no schema: an item id, a schema name and
    the answer fields of some kind (``potato.prefill.prediction_shapes``, the one
    place that says what each kind's prediction is, and which the writeback
    and the holdout evaluation apply with each schema's kind).
    """
    try:
        _check_fields(record, _PREDICTION_FIELDS)
        check_answer_fields(record)
    except (BadField, ValueError) as exc:
        return str(exc)
    return None


def check_prediction_line(line: bytes, number: int) -> None:
    """One line of ``predictions.jsonl`` (``{"id", "schema"}`` and its kind's answer fields,
    ``potato.prefill.prediction_shapes``), or ``BadField``."""
    try:
        record = parse_json(line, f"predictions.jsonl line {number}")
    except ApiError as exc:
        raise BadField(exc.message) from None
    if not isinstance(record, dict):
        raise BadField(f"predictions.jsonl line {number} is {_show(record)}; each line is a JSON object "
                       '{"id", "schema", "label", "confidence"} (or value, spans or text for numbers, spans and text)')
    problem = prediction_problem(record)
    if problem:
        raise BadField(f"predictions.jsonl line {number}: {problem}")
