"""The agent protocol (docs/agent-protocol.md): its one home, served by both of Potato's HTTP servers.

Two servers speak it: ``potato start`` beside the Training page and the
admin API (potato/server), and an ssh or slurm run's flow, alone, on the
run's private UNIX socket (potato/tasks/protocol_server.py). Both take it
from here, so the layers read top-down: the web server and the flow's tasks
import the protocol; the protocol imports neither of them
(tests/unit/test_layers.py holds the rule).

- ``routes``      the views, thin: claim, bundle, status, events, predictions, result
- ``callers``     who a bearer token is and what it may do; read-only, so it runs before a body is read
- ``bodies``      what agents send, checked field by field
- ``predictions`` the upload, streamed and checked line by line
- ``state``       what the routes remember between requests; what a claim means for a run's state

Events are recorded by ``potato.run_events``, which the local backend's relay
uses too; ``potato.jsonapi`` holds what both Flask apps share (JSON errors,
strict bodies, admitting a body before reading it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from flask import Flask

    from potato.config import ProjectConfig
    from potato.store import Store

PREFIX = "/training/agent/v1"
PROTOCOL_VERSION = 1
POLL_INTERVAL_S = 1.0


def install(app: "Flask") -> None:
    """Serve the protocol on *app* (after ``potato.jsonapi.init_app``; the app holds the config and store)."""
    from potato.protocol.routes import bp
    from potato.protocol.state import AgentState

    app.extensions["potato.agent_state"] = AgentState()
    app.register_blueprint(bp)


def make_app(config: "ProjectConfig", store: "Store") -> "Flask":
    """A Flask app serving only the protocol: no Training page, no admin API (an ssh run's socket)."""
    from flask import Flask

    from potato import jsonapi

    app = Flask("potato.protocol")
    app.config.update(POTATO=config, MAX_CONTENT_LENGTH=jsonapi.MAX_JSON_BYTES)
    app.json.sort_keys = False
    app.extensions["potato.store"] = store
    jsonapi.init_app(app)
    install(app)
    return app
