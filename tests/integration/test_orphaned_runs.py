"""A flow that dies or hangs must not cost the one-run rule or the queue.

Each test kills (-9) or stops a real flow process while its real worker
trains locally, driven by `potato training run` (the fault matrix, tests/faults/,
kills flows on every backend under `potato start`). What the user must
see: the run fails with a reason that says what happened, whatever it left
running is gone before the next run starts, and the queue moves on without a
restart.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from potato.runs.ending import end_run
from potato.runs.paths import open_store, run_paths
from potato.runs.queue import create_run
from potato.runs.reconcile import reconcile
from potato.config import load_config
from tests.support.potato_project import make_project
from tests.support.runs import (
    potato_background, process_alive, processes_matching, run_dir_of, store_of, tiny_project, wait_for,
    wait_for_state, wait_for_training,
)

pytestmark = [pytest.mark.prefect, pytest.mark.training]
ENDED = ("succeeded", "failed", "cancelled")


def _queue_behind_a_long_run(config: Path, tmp_path: Path):
    """Run 1 trains "forever"; `potato training run` queues run 2 (one epoch) behind it and dispatches both."""
    cfg = load_config(config)
    create_run(cfg, open_store(cfg), options={"epochs": 100000})
    return potato_background("training", "run", str(config), "--option", "epochs=1", log=tmp_path / "cli.log")


def test_a_killed_flow_s_worker_is_stopped_before_the_next_run_starts(prefect_api, tmp_path):
    config = tiny_project(tmp_path)
    cli = _queue_behind_a_long_run(config, tmp_path)
    store = store_of(config)
    try:
        first = wait_for_training(store, 1)
        os.kill(first.flow_pid, signal.SIGKILL)  # the flow alone (the OOM killer's choice); its worker trains on
        wait_for_state(store, 2, ("running", *ENDED), timeout=60)
        assert not process_alive(first.worker_pid), "run 2 started beside run 1's worker"
        assert cli.wait(timeout=180) == 0, (tmp_path / "cli.log").read_text()
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
    first, second = store.get_run(1), store.get_run(2)
    assert first.state == "failed"
    assert first.error == ("The run's flow process was killed by SIGKILL before the run finished; Potato stopped "
                           f"what the run left running (see {run_dir_of(config, 1) / 'flow.log'})")
    log = (run_dir_of(config, 1) / "run.log").read_text()
    assert f"Stopped what the run left running: stopped the worker's process group {first.worker_pid}" in log
    assert second.state == "succeeded" and second.started_at >= first.finished_at
    assert processes_matching(str(tmp_path)) == []


def test_an_orphaned_run_fails_without_a_restart_and_the_queue_moves_on(prefect_api, tmp_path):
    config = tiny_project(tmp_path, trainer={"epochs": 100000})
    first_cli = potato_background("training", "run", str(config), log=tmp_path / "first.log")
    store = store_of(config)
    second_cli = None
    try:
        first = wait_for_training(store, 1)
        second_cli = potato_background("training", "run", str(config), "--option", "epochs=1",
                                       log=tmp_path / "second.log")
        # The second CLI follows run 2: it reconciled once on its start, with run 1's flow alive.
        wait_for(lambda: "[run 2] queued" in (tmp_path / "second.log").read_text(), 30, "the second CLI to follow")
        # The terminal of the first CLI dies with its flow: nobody is left who owns run 1.
        os.killpg(first_cli.pid, signal.SIGKILL)
        os.kill(first.flow_pid, signal.SIGKILL)
        assert second_cli.wait(timeout=180) == 0, (tmp_path / "second.log").read_text()
    finally:
        for cli in (first_cli, second_cli):
            if cli is not None and cli.poll() is None:
                os.killpg(cli.pid, signal.SIGKILL)
    first = store.get_run(1)
    assert (first.state, first.error) == ("failed", (
        f"The run's flow process is gone (pid {first.flow_pid} ended without recording the run's end); "
        "Potato stopped what the run left running and marked it failed"))
    assert not process_alive(first.worker_pid)
    assert store.get_run(2).state == "succeeded" and store.get_run(2).started_at >= first.finished_at
    assert processes_matching(str(tmp_path)) == []


def test_a_wedged_flow_is_failed_when_its_heartbeat_is_stale(prefect_api, tmp_path):
    config = tiny_project(tmp_path, heartbeat_timeout_s=10, grace_seconds=1, trainer={"epochs": 100000})
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    try:
        first = wait_for_training(store, 1)
        os.kill(first.flow_pid, signal.SIGSTOP)  # the flow hangs…
        os.kill(first.worker_pid, signal.SIGSTOP)  # …and its worker falls silent
        failed = wait_for_state(store, 1, ENDED, timeout=60)
        assert cli.wait(timeout=60) == 1, (tmp_path / "cli.log").read_text()
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
    assert (failed.state, failed.error) == ("failed", (
        f"No word from the worker on local for 10 seconds, and the run's flow (pid {first.flow_pid}) did not end "
        "the run within 16 s more; Potato stopped the flow"))
    assert not process_alive(first.flow_pid) and not process_alive(first.worker_pid)
    assert processes_matching(str(tmp_path)) == []




def test_a_stop_that_cannot_be_verified_holds_the_queue_until_the_agent_has_stopped_itself(tmp_path):
    """The host is unreachable: the run stays active (no run starts beside its worker) until its agent's
    offline limit has passed; then it fails, saying that stopping was not verified."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]  # nothing listens there once the socket closes
    config = make_project(tmp_path, n_items=4, model_training={"enabled": True, "backends": {
        "gpu-server": {"type": "ssh", "host": "127.0.0.1", "port": closed_port}}})
    cfg = load_config(config)
    store = open_store(cfg)
    run = create_run(cfg, store, backend="gpu-server")
    queued = create_run(cfg, store)
    store.claim_next_queued(only_when_idle=True)
    job_dir, sock = "/home/u/.cache/potato-training/jobs/1-0a1b2c3d", "/tmp/potato-1-0123456789ab.sock"
    store.update_run(run.id, remote_job_dir=job_dir, remote_socket=sock, heartbeat_at=time.time())
    reason = "The run's flow process is gone (pid 4242 ended without recording the run's end)"

    held = end_run(cfg, store, run.id, "failed", reason)
    assert held.state == "running" and held.ending["state"] == "failed" and held.ending["error"] == reason
    assert held.step.startswith("stopping what the run left running: could not reach 127.0.0.1 to stop the run's "
                                "agent and worker (ssh to 127.0.0.1 failed: Connection refused.")
    assert held.cancel_requested_at  # an agent that can still post is told to stop
    assert store.claim_next_queued(only_when_idle=True) is None  # the queue waits
    assert reconcile(cfg, store) == []  # tried again only after RETRY_STOP_S

    # 300 s after the agent was last heard from, it has stopped its worker by itself.
    store.update_run(run.id, heartbeat_at=time.time() - 400, ending=dict(held.ending, last_try=0))
    [ended] = reconcile(cfg, store, release_slot=False)
    assert (ended.id, ended.state, ended.ending) == (run.id, "failed", {})
    assert ended.error.startswith(f"{reason}. Potato could not verify that the run's agent and worker on its host "
                                  "stopped (could not reach 127.0.0.1")
    assert ended.error.endswith("an agent stops its worker by itself after 300 s without the server, and that time "
                                "has passed")
    log = (run_paths(cfg, run.id).dir / "run.log").read_text()
    assert "The run ends failed, but Potato could not verify that its worker stopped" in log
    assert store.claim_next_queued(only_when_idle=True).id == queued.id  # and the queue moves on
