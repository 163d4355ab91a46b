"""Fixtures shared by tests/unit/test_server_*.py (imported with ``from ... import *``).

This module holds no tests itself; it sits beside them because only
``test_server_*`` files belong to the server's tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from potato.config import ProjectConfig, load_config
from potato.runs.paths import open_store, run_paths
from potato.runs.store import Store
from potato.runs.tokens import register_agent
from potato.server import create_app
from tests.support.potato_project import make_project

__all__ = ["ADMIN", "BACKENDS", "V1", "project", "store", "app", "client", "admin", "running_run", "token",
           "bearer", "make_config"]

ADMIN = {"X-API-Key": "test-admin-key"}
V1 = "/training/agent/v1"

# The user guide's example backends.
BACKENDS = {
    "gpu-server": {"type": "ssh", "host": "gpu.example.org", "python": "/opt/conda/bin/python3",
                   "gpus": "auto", "min_free_gpu_mb": 4000},
    "cluster": {"type": "slurm", "host": "login.cluster.example.org", "python": "/opt/conda/bin/python3",
                "job_python": "/shared/envs/train/bin/python", "remote_dir": "/shared/projects/me/potato-training",
                "gres": "gpu:1", "time": "04:00:00", "prelude": ["module load cuda/12.4"]},
    "lab-workstation": {"type": "agent", "queue_timeout_s": 3600},
}


def make_config(root: Path, **model_training) -> ProjectConfig:
    mt = {"enabled": True, "backend": "gpu-server", "backends": BACKENDS}
    mt.update(model_training)
    return load_config(make_project(root, n_items=30, model_training=mt))


@pytest.fixture
def project(tmp_path) -> ProjectConfig:
    return make_config(tmp_path)


@pytest.fixture
def store(project) -> Store:
    s = open_store(project)
    yield s
    s.close()


@pytest.fixture
def app(project, store):
    return create_app(project, start_background=False, store=store)


@pytest.fixture
def client(app):
    return app.test_client()


class Admin:
    """The test client with the admin key on every request."""

    def __init__(self, client):
        self.client = client

    def __getattr__(self, method):
        def call(url, **kw):
            kw.setdefault("headers", {}).update(ADMIN)
            return getattr(self.client, method)(url, **kw)
        return call


@pytest.fixture
def admin(client) -> Admin:
    return Admin(client)


@pytest.fixture
def running_run(project, store):
    """Make a run on *backend* that the dispatcher has started, with its bundle built."""
    from potato.bundle.build import build_bundle
    from potato.runs.queue import create_run

    def make(backend: str = "lab-workstation", *, bundle: bool = True):
        run = create_run(project, store, trainer="hf-text-classification", schemas=["sentiment"],
                         backend=backend)
        assert store.transition(run.id, "running", from_states=("queued",))
        if bundle:
            build_bundle(project, ["sentiment"], run_paths(project, run.id).dir / "bundle")
        return store.get_run(run.id)

    return make


@pytest.fixture
def token(project, store) -> str:
    """The agent token of the example lab-workstation backend."""
    return register_agent(project, store, "lab-workstation")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
