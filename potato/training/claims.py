"""Check a claimed job before the agent acts on it: every field, its type, its range.

The agent turns a claim into a directory it deletes and recreates
(``<workdir>/jobs/<run_id>``), into URLs it calls, a checksum it trusts and a
grace period it waits. A claim whose ``run_id`` were ``"../.."`` or an
absolute path would point that ``rmtree`` anywhere, so nothing in it is used
before ``check_claim`` has accepted it (docs/agent-protocol.md, "Claim a
job", lists the fields).

Part of the remote half: Python 3.8, standard library only.
"""

import math
import re
from typing import Any, Dict, Optional

from potato.training.trainers.uncertainty import check_order
from potato.training.parts import check_parts

URL_KEYS = ("status", "events", "predictions", "result")
MAX_RUN_ID = 2 ** 63 - 1      # SQLite's INTEGER
MAX_SECONDS = 7 * 24 * 3600
_SHA256 = re.compile(r"[0-9a-f]{64}")


class BadClaim(Exception):
    """A claim the agent will not act on; the message names the field and what was wrong."""

    def __init__(self, message: str, run_id: Optional[int] = None, urls: Optional[Dict[str, str]] = None):
        super().__init__(message)
        self.run_id = run_id  # set once run_id and urls passed: the failure can then be reported
        self.urls = urls


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_path(value: Any, where: str, run_id: int) -> str:
    """A protocol path of this run: ``/…/runs/<run_id>…``, no ``..``, no control characters."""
    prefix_ok = isinstance(value, str) and value.startswith("/") and len(value) <= 2000
    if not prefix_ok or ".." in value or any(ord(c) <= 32 or ord(c) == 127 for c in value) \
            or "/runs/{}/".format(run_id) not in value + "/":
        raise BadClaim("{} is {!r}; expected a path on this server under /runs/{}/".format(
            where, str(value)[:200], run_id))
    return value


def check_claim(claim: Any) -> Dict[str, Any]:
    """Return *claim* if the agent may act on it; raise ``BadClaim`` naming the first bad field."""
    if not isinstance(claim, dict):
        raise BadClaim("the job is {}, not a JSON object".format(type(claim).__name__))
    run_id = claim.get("run_id")
    if not _whole(run_id) or not 1 <= run_id <= MAX_RUN_ID:
        raise BadClaim("run_id is {!r}; expected a positive whole number".format(str(run_id)[:200]))
    urls = claim.get("urls")
    if not isinstance(urls, dict):
        raise BadClaim("urls is {!r}; expected an object with {}".format(str(urls)[:200], ", ".join(URL_KEYS)))
    checked = {key: check_path(urls.get(key), "urls." + key, run_id) for key in URL_KEYS}
    try:
        _check_fields(claim, run_id)
    except BadClaim as exc:
        raise BadClaim(str(exc), run_id, checked) from None
    return claim


def _check_fields(claim: Dict[str, Any], run_id: int) -> None:
    check_path(claim.get("bundle_url"), "bundle_url", run_id)
    sha = claim.get("bundle_sha256")
    if sha is not None and not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
        raise BadClaim("bundle_sha256 is {!r}; expected 64 hexadecimal digits".format(str(sha)[:200]))
    size = claim.get("bundle_bytes")
    if size is not None and not (_whole(size) and size >= 0):
        raise BadClaim("bundle_bytes is {!r}; expected a whole number of bytes".format(size))
    for key in ("grace_seconds", "heartbeat_timeout_s"):
        value = claim.get(key)
        if value is not None and not (_number(value) and 0 <= value <= MAX_SECONDS):
            raise BadClaim("{} is {!r}; expected a number of seconds from 0 to {}".format(key, value, MAX_SECONDS))
    job = claim.get("job")
    if not isinstance(job, dict):
        raise BadClaim("job is {!r}; expected the worker's job.json as an object".format(str(job)[:200]))
    if job.get("run_id", run_id) != run_id:
        raise BadClaim("job.run_id is {!r}, not the claim's run_id {}".format(job.get("run_id"), run_id))
    if not isinstance(job.get("trainer"), str):
        raise BadClaim("job.trainer is {!r}; expected a trainer's name".format(job.get("trainer")))
    schemas = job.get("schemas", [])
    if not (isinstance(schemas, list) and all(isinstance(s, str) for s in schemas)):
        raise BadClaim("job.schemas is {!r}; expected a list of schema names".format(schemas))
    if not isinstance(job.get("options", {}), dict):
        raise BadClaim("job.options is {!r}; expected an object".format(job.get("options")))
    problem = check_parts(job.get("parts")) or check_order(job.get("order"))
    if problem:
        raise BadClaim("job." + problem)
