"""The Prefect deployment path: deploy, a `process` worker, `prefect deployment run` → a run in the store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.runs import store_of, tiny_project, wait_for, wait_for_state

pytestmark = [pytest.mark.prefect, pytest.mark.training]

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))


def test_prefect_deployment_run_creates_and_runs_a_run(prefect_api, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PREFECT_WORKER_QUERY_SECONDS="1")
    created = subprocess.run([sys.executable, "-m", "deployments.create"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
    assert created.returncode == 0, created.stdout + created.stderr
    assert "Deployment training-run/potato is on work pool 'potato-training'" in created.stdout

    config = tiny_project(tmp_path)
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "potato-training"], env=env, cwd=tmp_path,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        started = subprocess.run(
            [PREFECT, "deployment", "run", "training-run/potato", "--param", f"config={config}",
             "--param", "backend=local"],
            env=env, capture_output=True, text=True, timeout=120,
        )
        assert started.returncode == 0, started.stdout + started.stderr
        store = store_of(config)
        wait_for(lambda: store.list_runs(), 120, "the flow to create its run in the store")
        run = wait_for_state(store, 1, ("succeeded", "failed", "cancelled"), timeout=180)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:  # an idle worker may ignore one SIGTERM (notes/prefect-3.md)
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
    assert (run.state, run.backend, run.error) == ("succeeded", "local", None), (tmp_path / "worker.log").read_text()
    assert run.prefect_flow_run_id
    assert run.scores["sentiment"]["n"] > 0
