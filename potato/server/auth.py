"""Who may use the Training page and the admin API.

An admin is a request that carries the config's ``admin_api_key``:

- in the ``X-API-Key`` header (scripts, the admin API), or
- in the signed session cookie that the login form sets (the page).

The key is never accepted in a URL (URLs end up in logs and browser history).
Keys are compared in constant time. A wrong or missing key gets 401 with the
same sentence whatever was wrong, so the answer gives no hint of the key.

With ``debug: true`` a loopback request is an admin without a key:
that is why ``potato start`` warns when debug is on while an ssh or slurm
backend is configured — their agents' requests arrive through a reverse
forwarded socket, i.e. from loopback.

Cross-site requests: the session cookie is ``SameSite=Strict`` and a state
changing request authenticated by the cookie must also carry the header
``X-Requested-With: potato`` (which a cross-site form cannot send and a
cross-site script cannot add without a CORS preflight this server refuses).
"""

from __future__ import annotations

import hashlib
import hmac
from functools import wraps
from typing import Callable

from flask import current_app, request, session

from potato.protocol.jsonapi import ApiError, admits

UNAUTHORIZED = "Missing or wrong admin key: send the config's admin_api_key in the X-API-Key header"
CSRF_HEADER = "X-Requested-With"
CSRF_VALUE = "potato"
LOOPBACK = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})


def _key() -> str | None:
    return current_app.config["POTATO"].admin_api_key


def key_matches(given: str | None) -> bool:
    """Constant-time comparison of *given* with the config's admin key."""
    key = _key()
    if not key or given is None:
        # Compare anyway, so timing does not tell "no key configured" apart.
        hmac.compare_digest(b"x" * 32, b"y" * 32)
        return False
    return hmac.compare_digest(given.encode("utf-8"), key.encode("utf-8"))


def key_fingerprint() -> str:
    """What the session stores: a hash of the key, so changing the key logs everyone out."""
    key = _key() or ""
    return hashlib.sha256(b"potato-admin:" + key.encode("utf-8")).hexdigest()


def via_debug_loopback() -> bool:
    return bool(current_app.config["POTATO"].debug) and request.remote_addr in LOOPBACK


def admin_via() -> str | None:
    """How this request is an admin: ``"header"``, ``"session"``, ``"debug"``, or None."""
    header = request.headers.get("X-API-Key")
    if header is not None:
        return "header" if key_matches(header) else None
    stored = session.get("admin")
    if stored is not None and _key() and hmac.compare_digest(str(stored), key_fingerprint()):
        return "session"
    if via_debug_loopback():
        return "debug"
    return None


def check_admin(**_: object) -> None:
    """Refuse a request that is not an admin's: 401, or 403 for a cookie without the CSRF header."""
    via = admin_via()
    if via is None:
        raise ApiError(401, UNAUTHORIZED)
    if via == "session" and request.method not in ("GET", "HEAD", "OPTIONS"):
        if request.headers.get(CSRF_HEADER) != CSRF_VALUE:
            raise ApiError(403, f"A request authenticated by the session cookie must send the "
                           f"header {CSRF_HEADER}: {CSRF_VALUE}")


def require_admin(view: Callable) -> Callable:
    """Decorator for admin API views: 401 JSON unless the request is an admin, checked before its body is read."""

    @wraps(view)
    def wrapped(*args, **kwargs):
        check_admin()
        return view(*args, **kwargs)

    return admits(check_admin)(wrapped)


def log_in(given: str | None) -> bool:
    if not key_matches(given):
        return False
    session.clear()
    session["admin"] = key_fingerprint()
    session.permanent = True
    return True


def log_out() -> None:
    session.clear()
