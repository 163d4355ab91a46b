"""The deployment path's faults: a Prefect worker killed, and its SIGTERM on cancel.

Here runs go through ``model_training.prefect_deployment: training-run/potato``:
a real ``prefect worker start --pool potato-training`` starts each flow as
``python -m prefect.engine`` in a process group of its own. A fault project
of its own (``open_bench``) with that setting is served by its own ``potato
start``.

- The worker killed with -9 mid-run: the flow it started lives on in its own
  session, finishes the run, and the next run waits for a worker.
- The worker and that flow both killed (a reboot, the OOM killer): the run is
  reconciled like any dead flow's, by ``potato start``'s dispatcher.
- A cancel in Prefect: the worker sends SIGTERM to the flow's whole process
  group. The run's ssh clients are not in it (``openssh`` starts them in
  sessions of their own), so the worker is stopped as Cancel run stops it —
  SIGTERM, ``grace_seconds``, the agent reports — and the run ends
  ``cancelled``, not failed by a connection that dropped under it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.faults import open_bench
from tests.faults.test_kills import LONG, start_agent_for
from tests.support.runs import wait_for

pytestmark = [pytest.mark.sshd, pytest.mark.slurm, pytest.mark.prefect, pytest.mark.training]

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
ENV = {"HF_HUB_OFFLINE": "1", "PREFECT_WORKER_QUERY_SECONDS": "1"}


class PrefectWorker:
    """``prefect worker start --pool potato-training``; kill -9 and start again at will."""

    def __init__(self, log: Path):
        self.log = log
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen([PREFECT, "worker", "start", "--pool", "potato-training"],
                                            env=dict(os.environ, **ENV), cwd=self.log.parent, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:  # an idle worker may ignore one SIGTERM (measured)
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def deployed(prefect_api, sshd_service, slurm_service, ssh_proxy, shared_model, tmp_path_factory):
    created = subprocess.run([sys.executable, "-m", "deployments.create"], cwd=REPO, env=dict(os.environ, **ENV),
                             capture_output=True, text=True, timeout=300)
    assert created.returncode == 0, created.stdout + created.stderr
    root = tmp_path_factory.mktemp("deployed")
    worker = PrefectWorker(root.parent / "prefect-worker.log")
    worker.start()
    try:
        with open_bench(root, (sshd_service, slurm_service), ssh_proxy, shared_model, grace_seconds=5,
                        prefect_deployment="training-run/potato") as bench:
            bench.prefect_worker = worker
            yield bench
    finally:
        worker.stop()


@pytest.fixture
def deployed_case(deployed):
    deployed.ssh_proxy.heal()
    started = time.monotonic()
    yield started
    deployed.stop_agents()


@pytest.mark.parametrize("backend", ["local", "gpu-server", "cluster", "lab"])
def test_kill_the_prefect_worker_during_training(deployed, deployed_case, backend, request):
    bench = deployed
    workdir = start_agent_for(bench, backend, request)
    run_id = bench.server.start_run(backend, epochs=12)
    bench.wait_for_training(run_id, timeout=180)
    os.kill(bench.prefect_worker.process.pid, signal.SIGKILL)
    bench.prefect_worker.process.wait(timeout=10)
    try:
        bench.wait_for_end(run_id, 180)
    finally:
        bench.prefect_worker.start()  # for the next run
    bench.verdict("kill -9 the Prefect worker during training (deployment)", run_id, "succeeded", None,
                  started=deployed_case, agent_workdir=workdir,
                  note="the flow (python -m prefect.engine, a session of its own) finished the run")


@pytest.mark.parametrize("backend", ["local", "gpu-server", "cluster", "lab"])
def test_kill_the_prefect_worker_and_its_flow_during_training(deployed, deployed_case, backend, request):
    """The worker and the flow it started both die (a reboot, the OOM killer): reconciled like a dead flow."""
    bench = deployed
    workdir = start_agent_for(bench, backend, request)
    run_id = bench.server.start_run(backend, **LONG)
    run = bench.wait_for_training(run_id, timeout=180)
    os.kill(bench.prefect_worker.process.pid, signal.SIGKILL)
    bench.prefect_worker.process.wait(timeout=10)
    os.kill(run.flow_pid, signal.SIGKILL)
    try:
        bench.wait_for_end(run_id, 120)
    finally:
        bench.prefect_worker.start()  # for the next run
    bench.verdict("kill -9 the Prefect worker and its flow during training (deployment)", run_id, "failed",
                  f"The run's flow process is gone (pid {run.flow_pid} ended without recording the run's end); "
                  f"Potato stopped what the run left running and marked it failed",
                  started=deployed_case, agent_workdir=workdir,
                  note="potato start's reconciliation stopped the worker and freed the Prefect slot")


@pytest.mark.parametrize("backend", ["local", "gpu-server", "cluster", "lab"])
def test_a_cancel_in_prefect_stops_the_run_as_cancel_run_does(deployed, deployed_case, backend, request):
    bench = deployed
    workdir = start_agent_for(bench, backend, request)
    run_id = bench.server.start_run(backend, **LONG)
    run = bench.wait_for_training(run_id, timeout=180)
    cancel = subprocess.run([PREFECT, "flow-run", "cancel", run.prefect_flow_run_id], env=dict(os.environ, **ENV),
                            capture_output=True, text=True, timeout=120)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    bench.wait_for_end(run_id, 120)
    done = wait_for(lambda: [e.data for e in bench.store.events(run_id) if e.kind == "done"], 10,
                    "the worker's last event")
    assert done[-1]["status"] == "cancelled"  # the worker got SIGTERM and stopped itself: not a dropped link
    bench.verdict("Prefect worker's SIGTERM to the flow's group (cancel in Prefect)", run_id, "cancelled",
                  "Cancelled in Prefect", started=deployed_case, agent_workdir=workdir)
