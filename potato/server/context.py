"""The app's config and store, for the views of every blueprint (set up by ``potato.server.create_app``)."""

from __future__ import annotations

from flask import current_app

from potato.config import ProjectConfig
from potato.runs.store import Store


def get_store() -> Store:
    return current_app.extensions["potato.runs.store"]


def get_config() -> ProjectConfig:
    return current_app.config["POTATO"]
