"""Deciding that a run is orphaned, and reading what stopping it found."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from potato.backend_types.contract import Stopped
from potato.backends.local.steps import stop_leftovers as stop_local_worker
from potato.backends.ssh.leftovers import read_stop_report
from potato.config import load_config
from potato.runs.paths import open_store, run_paths
from potato.runs.queue import create_run
from potato.runs.reconcile import orphan_reason, reconcile
from potato.runs.store import Run
from tests.support.potato_project import make_project

NOW = 1_000_000.0


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    root = tmp_path_factory.mktemp("endings")
    return load_config(make_project(root, n_items=4, model_training={
        "enabled": True, "grace_seconds": 5, "heartbeat_timeout_s": 60,
        "backends": {"gpu-server": {"type": "ssh", "host": "gpu.example.org", "heartbeat_timeout_s": 100}}}))


def _run(**fields) -> Run:
    values = dict(id=7, trainer="t", schemas=[], backend="local", state="running", started_at=NOW - 600,
                  flow_pid=4242, heartbeat_at=NOW - 1)
    values.update(fields)
    return Run(**values)


@pytest.mark.parametrize("run, flow_alive, reason", [
    (_run(), True, None),
    (_run(state="queued"), False, None),
    # Silent, but within timeout + grace + margin: the flow acts on it itself.
    (_run(heartbeat_at=NOW - 60 - 5 - 15), True, None),
    (_run(heartbeat_at=NOW - 81), True,
     "No word from the worker on local for 60 seconds, and the run's flow (pid 4242) did not end the run "
     "within 20 s more; Potato stopped the flow"),
    (_run(backend="gpu-server", heartbeat_at=NOW - 121), True,
     "No word from the agent on gpu-server for 100 seconds, and the run's flow (pid 4242) did not end the run "
     "within 20 s more; Potato stopped the flow"),
    (_run(heartbeat_at=None), True, None),  # not spawned yet: no heartbeat to judge
    (_run(heartbeat_at=NOW - 10_000), False,
     "The run's flow process is gone (pid 4242 ended without recording the run's end); Potato stopped what the "
     "run left running and marked it failed"),
    (_run(flow_pid=None, started_at=NOW - 5), False, None),  # just claimed: its flow is coming
    (_run(flow_pid=None, prefect_flow_run_id="abc"), False, None),  # waits for a Prefect worker
    (_run(flow_pid=None), False, "The run's flow process is gone (it never started); Potato marked the run failed"),
])
def test_orphan_reason(config, run, flow_alive, reason):
    assert orphan_reason(config, run, now=NOW, flow_alive=flow_alive) == reason


@pytest.mark.parametrize("report, stopped", [
    ({"killed": [], "left": [], "slurm": {"job": None, "gone": True}}, Stopped(True, "")),
    ({"killed": ["python -m potato.training.agent …", "python -m potato.training.worker …"], "left": [],
      "slurm": {"job": "42", "gone": True, "cancelled": True, "state": "RUNNING"}},
     Stopped(True, "killed 2 process(es) of the run on gpu, cancelled SLURM job 42 (RUNNING); squeue no longer "
                   "lists it")),
    ({"killed": ["w"], "left": ["python -m potato.training.worker /jobs/7-0a1b2c3d"], "slurm": {}},
     Stopped(False, "1 process(es) of the run still run on gpu after SIGKILL: python -m potato.training.worker "
                    "/jobs/7-0a1b2c3d")),
    ({"left": [], "slurm": {"job": "42", "gone": False, "state": "COMPLETING"}},
     Stopped(False, "SLURM job 42 is still in the queue (COMPLETING)")),
])
def test_read_stop_report(report, stopped):
    assert read_stop_report("gpu", report) == stopped


def test_a_local_worker_left_by_a_dead_flow_is_killed_with_its_group(config):
    directory = run_paths(config, 7).dir
    # A stand-in with the worker's command line and a child of its own, like a trainer's helper process.
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"
    worker = subprocess.Popen([sys.executable, "-c", script, "-m", "potato.training.worker", str(directory)],
                              start_new_session=True)
    try:
        assert stop_local_worker(config, None, _run(worker_pid=worker.pid)) == Stopped(
            True, f"stopped the worker's process group {worker.pid} on this machine")
        assert worker.wait(timeout=5) == -signal.SIGKILL
        assert stop_local_worker(config, None, _run(worker_pid=worker.pid)) == Stopped(True, "")  # nothing left
    finally:
        try:
            os.killpg(worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_reused_process_group_id_is_left_alone(config):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        assert stop_local_worker(config, None, _run(worker_pid=other.pid)) == Stopped(True, "")
        assert other.poll() is None  # not this run's worker: not killed
    finally:
        other.kill()
        other.wait()


def test_a_queued_run_whose_own_flow_died_before_its_turn_fails(tmp_path):
    config = load_config(make_project(tmp_path, n_items=3))
    store = open_store(config)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run = create_run(config, store)
    assert store.adopt(run.id, "a-flow-run", gone.pid)
    assert [r.id for r in reconcile(config, store, release_slot=False)] == [run.id]
    run = store.get_run(run.id)
    assert (run.state, run.error) == ("failed", f"The run's flow process is gone (pid {gone.pid} ended while the "
                                                "run waited for its turn); Potato marked the run failed")
