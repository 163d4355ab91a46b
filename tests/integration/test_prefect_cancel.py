"""Cancel from either side: Prefect's cancel stops a Potato run as Cancel run does, and Potato's shows in Prefect.

The flow here is the dispatcher's child process (the embedded default); the
deployment path, with a real Prefect worker, is in test_deployment.py, and
Potato's own cancel showing in Prefect in test_local_runs.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.runs import (
    potato_background, process_alive, processes_matching, run_dir_of, store_of, tiny_project, wait_for,
    wait_for_state, wait_for_training,
)

pytestmark = [pytest.mark.prefect, pytest.mark.training]

PREFECT = str(Path(sys.executable).with_name("prefect"))


def flow_run_state(flow_run_id: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state


def prefect_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PREFECT, *args], capture_output=True, text=True, timeout=120, env=dict(os.environ))


def test_cancelling_the_flow_run_in_prefect_cancels_the_run(prefect_api, tmp_path):
    config = tiny_project(tmp_path, grace_seconds=5, trainer={"epochs": 100000})
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    try:
        run = wait_for_training(store, 1)
        cancel = prefect_cli("flow-run", "cancel", run.prefect_flow_run_id)
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        run = wait_for_state(store, 1, ("cancelled", "failed", "succeeded"), timeout=30)
    finally:
        cli.wait(timeout=60)
    assert (run.state, run.error) == ("cancelled", "Cancelled in Prefect")
    state = wait_for(lambda: (s := flow_run_state(run.prefect_flow_run_id)).is_final() and s, 30,
                     "the flow run to reach a final state")
    assert (state.type.value, state.message) == ("CANCELLED", "Run 1 was cancelled in Prefect; its worker was stopped")
    log = (run_dir_of(config, 1) / "run.log").read_text()
    assert ("The flow run was cancelled in Prefect: cancelling run 1 as Cancel run does "
            "(SIGTERM, then SIGKILL after 5 s)") in log
    done = [e for e in store.events(1) if e.kind == "done"]
    assert done and done[-1].data["status"] == "cancelled"  # the worker got SIGTERM and stopped cleanly
    assert "Run 1 was cancelled" in (tmp_path / "cli.log").read_text() and cli.returncode == 1
    assert not process_alive(run.worker_pid) and not process_alive(run.flow_pid)
    assert processes_matching(str(tmp_path)) == []


def test_sigterm_to_the_dispatchers_flow_fails_the_run_saying_so(prefect_api, tmp_path):
    """SIGTERM is how the dispatcher stops its flows when the server stops: not a cancel, not the wall clock."""
    config = tiny_project(tmp_path, grace_seconds=5, max_wall_seconds=600, trainer={"epochs": 100000})
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    try:
        run = wait_for_training(store, 1)
        os.kill(run.flow_pid, signal.SIGTERM)
        run = wait_for_state(store, 1, ("cancelled", "failed", "succeeded"), timeout=60)
    finally:
        cli.wait(timeout=60)
    assert (run.state, run.error) == ("failed", "The flow process was stopped (SIGTERM) while the run was active")
    wait_for(lambda: not process_alive(run.flow_pid), 30, "the flow process to exit")
    assert not process_alive(run.worker_pid) and processes_matching(str(tmp_path)) == []
