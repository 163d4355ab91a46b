"""The annotation server's training surface: the Training page, the admin API, the agent protocol.

``create_app(config)`` builds the Flask app (no module-level app, so each test
builds its own). Three blueprints, one per audience:

- ``page``      ``/admin/training``            the Training page and run pages (HTML, admin)
- ``admin_api`` ``/admin/training/api``        JSON for the page and for scripts (``X-API-Key``);
  ``publish_api`` adds its routes for publishing to the Hugging Face Hub and downloading a model
- the agent protocol ``/training/agent/v1`` (bearer tokens), from its own home ``potato.protocol``,
  which an ssh run's socket serves too

The store: one ``Store`` per app (``potato.server.context.get_store()``); it already gives every
thread its own SQLite connection, so a request reuses its thread's connection
instead of opening one per request.
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping

from flask import Flask

from potato.config import ProjectConfig
from potato.protocol.jsonapi import MAX_JSON_BYTES
from potato.runs.store import Store


def _secret_key(training_dir: Path) -> bytes:
    """The session-signing key, kept in ``training/server_secret`` (mode 0600) across restarts."""
    path = training_dir / "server_secret"
    try:
        data = path.read_bytes()
        if len(data) >= 32:
            return data
    except FileNotFoundError:
        pass
    training_dir.mkdir(parents=True, exist_ok=True)
    data = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return data


def create_app(config: ProjectConfig, *, start_background: bool = True,
               store: Store | None = None, overrides: Mapping[str, Any] | None = None) -> Flask:
    """Build the app for *config*.

    With *start_background*, the embedded Prefect API and the run dispatcher
    start now and run until ``app.extensions["potato.background"].stop()``
    (``potato start`` stops them on SIGTERM/SIGINT). Tests pass False and
    drive the store themselves. *overrides* update ``app.config``.
    """
    from potato.protocol import jsonapi
    from potato.protocol.app import install as install_protocol
    from potato.runs.paths import open_store
    from potato.runs.prefect_api import ui_url_for
    from potato.server import admin_api, page, publish_api
    from potato.server.background import Background

    app = Flask(__name__)
    app.config.update(
        POTATO=config,
        SECRET_KEY=_secret_key(config.training_dir),
        MAX_CONTENT_LENGTH=MAX_JSON_BYTES,
        SESSION_COOKIE_NAME="potato_training_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        PERMANENT_SESSION_LIFETIME=timedelta(days=7),
        JSON_SORT_KEYS=False,
        PREFECT_UI_URL=ui_url_for(os.environ.get("PREFECT_API_URL")),
    )
    if overrides:
        app.config.update(overrides)
    app.json.sort_keys = False
    app.extensions["potato.runs.store"] = store if store is not None else open_store(config)

    jsonapi.init_app(app)
    app.register_blueprint(page.bp)
    app.register_blueprint(admin_api.bp)
    app.register_blueprint(publish_api.bp)
    install_protocol(app)

    background = Background(config, app.extensions["potato.runs.store"])
    app.extensions["potato.background"] = background
    if start_background:
        background.start()
        if background.prefect_ui_url:
            app.config["PREFECT_UI_URL"] = background.prefect_ui_url
    return app

