"""A real Prefect API shared by the whole test session.

``prefect_api`` starts ONE ``prefect server start`` (via
``potato.runs.prefect_api.start_embedded``) in a session temp dir, sets
``PREFECT_API_URL`` in ``os.environ`` (flows in the test process and child
processes use it) and stops the server at session end. Projects share it as
projects share a user's Prefect server: each flow holds its own project's
concurrency limit, so tests on different projects never wait for each other. Session-scoped because a start costs
seconds (notes: ``prefect_test_harness`` ≈8 s per start).

A fresh Prefect database spends about half its start in migrations
(measured: 13–16 s cold, 7 s on an existing database). So the first session
keeps a copy of the just-migrated, still empty database in pytest's cache
(``.pytest_cache/d/potato-prefect/``, one per Prefect version) and later
sessions start from that copy. Every session still gets its own empty
database; delete the cache (``pytest --cache-clear``) to start from scratch.

With ``PREFECT_API_URL`` already set in the environment, that API is used
and nothing is started (``home`` and ``training_dir`` are then None).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest

from potato.runs.prefect_api import EmbeddedServer, prefect_home, start_embedded


@dataclass(frozen=True)
class PrefectApi:
    """The session's Prefect API."""

    url: str                    # e.g. http://127.0.0.1:43121/api
    home: Path | None           # the server's PREFECT_HOME (None: external API)
    training_dir: Path | None   # the training dir whose prefect/ is ``home``
    server: EmbeddedServer
    start_seconds: float        # what starting (or reaching) it cost


def _template_path(config: pytest.Config) -> Path | None:
    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
    if cache is None:
        return None
    return cache.mkdir("potato-prefect") / f"prefect-{version('prefect')}.db"


def _save_template(database: Path, template: Path) -> None:
    # The backup API copies a live WAL database consistently; write under a
    # temporary name, then rename, as concurrent sessions may race here.
    tmp = template.with_name(f"{template.name}.{os.getpid()}.tmp")
    src = sqlite3.connect(database)
    dst = sqlite3.connect(tmp)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    os.replace(tmp, template)


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory, pytestconfig) -> PrefectApi:
    training_dir = tmp_path_factory.mktemp("prefect-api") / "training"
    home = prefect_home(training_dir)
    home.mkdir(parents=True)
    template = None if os.environ.get("PREFECT_API_URL") else _template_path(pytestconfig)
    if template is not None and template.exists():
        shutil.copyfile(template, home / "prefect.db")
    started = time.monotonic()
    server = start_embedded(training_dir, set_env=True)
    try:
        start_seconds = time.monotonic() - started
        if template is not None and not template.exists() and server.owned:
            _save_template(home / "prefect.db", template)
        yield PrefectApi(
            url=server.url,
            home=server.home,
            training_dir=training_dir if server.home else None,
            server=server,
            start_seconds=start_seconds,
        )
    finally:
        server.stop()
