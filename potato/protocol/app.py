"""Serving the agent protocol: on ``potato start``'s app, or alone on an ssh run's private socket."""

from __future__ import annotations

from flask import Flask

from potato.config import ProjectConfig
from potato.protocol import jsonapi
from potato.protocol.routes import bp
from potato.protocol.state import AgentState
from potato.runs.store import Store


def install(app: Flask) -> None:
    """Serve the protocol on *app* (after ``potato.protocol.jsonapi.init_app``; the app holds the config and store)."""
    app.extensions["potato.agent_state"] = AgentState()
    app.register_blueprint(bp)


def make_app(config: ProjectConfig, store: Store) -> Flask:
    """A Flask app serving only the protocol: no Training page, no admin API (an ssh run's socket)."""
    app = Flask("potato.protocol")
    app.config.update(POTATO=config, MAX_CONTENT_LENGTH=jsonapi.MAX_JSON_BYTES)
    app.json.sort_keys = False
    app.extensions["potato.runs.store"] = store
    jsonapi.init_app(app)
    install(app)
    return app
