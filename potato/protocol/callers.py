"""Who a request of the agent protocol comes from, and whether it may act on a run.

Every request carries ``Authorization: Bearer TOKEN``: an agent backend's
token (``potato training register``) or the run token the server gave the
agent of an ssh or slurm run (``potato.runs.tokens``). The answers, whatever the
route (docs/agent-protocol.md, "Authentication"):

- 401: no token, or one this server does not know (one sentence for all);
- 403: a known token used for another backend's or another run's business,
  or for a run no agent has claimed yet;
- 404: no such run (said only to a known token);
- 409: the run has ended. A run's token, and a backend token's hold on one of
  its runs, last only while the run is running: nothing an agent sends
  afterwards changes a run that is over.

These checks only read: they run before a request's body is read, on
waitress's I/O thread too (``potato.protocol.jsonapi.admits``). The views write the
sign of life (``last_seen``, the heartbeat) once they take the request.
"""

from __future__ import annotations

from flask import current_app, request

from potato.config import ProjectConfig
from potato.errors import UnknownRun
from potato.protocol.jsonapi import ApiError
from potato.protocol.state import AgentState
from potato.runs.store import END_STATES, Run, Store
from potato.runs.tokens import backend_of_token, run_of_token, tokens_equal
from potato.training.agent_protocol import PREFIX

BAD_TOKEN = "Missing or invalid agent token: send Authorization: Bearer <token>"
MAX_TOKEN_CHARS = 512


class Caller:
    """Who a request is: the agents of backend ``backend`` (a backend token) or of run ``run_id``."""

    def __init__(self, backend: str, run_id: int | None = None):
        self.backend = backend
        self.run_id = run_id


def config() -> ProjectConfig:
    return current_app.config["POTATO"]


def store() -> Store:
    return current_app.extensions["potato.runs.store"]


def agent_state() -> AgentState:
    return current_app.extensions["potato.agent_state"]


def bearer() -> str:
    """The request's bearer token; 401 when there is none."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_CHARS:
        raise ApiError(401, BAD_TOKEN)
    return token


def identify(token: str) -> Caller:
    """Which token *token* is: a backend's, or an active run's; 401 when it is none this server issued."""
    backend = backend_of_token(config(), store(), token)
    if backend is not None:
        return Caller(backend)
    run = run_of_token(store(), token, store().active_runs())
    if run is not None:
        return Caller(run.backend, run.id)
    raise ApiError(401, BAD_TOKEN)


def authorize_run(run_id: int) -> tuple[Run, Caller]:
    """Run *run_id* and the caller, if this request's token may act on it now; else 401/403/404/409."""
    token = bearer()
    try:
        run = store().get_run(run_id)
    except UnknownRun:
        run = None  # said only after the token is known: a stranger learns nothing of which runs exist
    if run is not None and run.run_token_hash and tokens_equal(token, run.run_token_hash):
        _refuse_if_ended(run)
        return run, Caller(run.backend, run.id)
    caller = identify(token)
    if run is None:
        raise ApiError(404, f"No run with id {run_id}")
    if caller.run_id is not None:
        raise ApiError(403, f"This token is the token of run {caller.run_id}; it cannot act on run {run_id}")
    if caller.backend != run.backend:
        raise ApiError(403, f"This token is backend {caller.backend!r}'s; run {run_id} runs on "
                       f"backend {run.backend!r}")
    _refuse_if_ended(run)
    if not agent_state().is_claimed(store(), run):
        raise ApiError(403, f"Run {run_id} has not been claimed by an agent; claim it first with "
                       f"POST {PREFIX}/backends/{run.backend}/claim")
    return run, caller


def _refuse_if_ended(run: Run) -> None:
    if run.state in END_STATES:
        raise ApiError(409, f"Run {run.id} has ended ({run.state}); nothing more is taken for it: "
                       "stop its worker", state=run.state)


def claimant(name: str) -> Caller:
    """The caller, if its token may claim jobs of backend *name*; else 401/403."""
    caller = identify(bearer())
    if caller.backend != name:
        raise ApiError(403, f"This token is backend {caller.backend!r}'s; it cannot claim jobs of "
                       f"backend {name!r}")
    return caller


def admit_claim(name: str, **_: object) -> None:
    """``admits`` check of a claim: a token of this backend."""
    claimant(name)


def admit_run(run_id: int, **_: object) -> None:
    """``admits`` check of a run's routes: this token may act on this run now."""
    authorize_run(run_id)
