"""The Prefect deployment path with a real `process` worker: runs, tags, cancel from either side, no worker.

One deployment (``python -m deployments.create``) and one worker serve the
module: a worker's start and each pickup cost seconds (measured).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from getpass import getuser
from pathlib import Path

import pytest

from potato.config import load_config
from potato.runs.prefect_runs import project_key_of
from tests.support.runs import (
    potato, potato_background, process_alive, processes_matching, run_dir_of, store_of, tiny_project, wait_for,
    wait_for_state, wait_for_training,
)

pytestmark = [pytest.mark.prefect, pytest.mark.training]

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
# The worker asks for work every second instead of every 10 (pickup 4–5 s instead of 7–14).
ENV = {"HF_HUB_OFFLINE": "1", "PREFECT_WORKER_QUERY_SECONDS": "1"}


def _env() -> dict:
    return dict(os.environ, **ENV)


def flow_run(flow_run_id: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def final_state(flow_run_id: str, timeout: float = 60):
    return wait_for(lambda: (s := flow_run(flow_run_id).state).is_final() and s, timeout,
                    f"flow run {flow_run_id} to reach a final state")


@pytest.fixture(scope="module")
def deployment(prefect_api) -> str:
    created = subprocess.run([sys.executable, "-m", "deployments.create"], cwd=REPO, env=_env(),
                             capture_output=True, text=True, timeout=300)
    assert created.returncode == 0, created.stdout + created.stderr
    assert created.stdout == (
        "Deployment training-run/potato is on work pool 'potato-training'\n"
        "Start a worker on the annotation server's host with:\n  prefect worker start --pool potato-training\n")
    return "training-run/potato"


@pytest.fixture(scope="module")
def prefect_worker(deployment, tmp_path_factory):
    """``prefect worker start --pool potato-training``, running for the module."""
    log_path = tmp_path_factory.mktemp("worker") / "worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "potato-training"], env=_env(),
                                  cwd=log_path.parent, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield log_path
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:  # an idle worker may ignore one SIGTERM (measured)
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)


def test_prefect_deployment_run_creates_and_runs_a_tagged_run(prefect_worker, tmp_path):
    config = tiny_project(tmp_path, n_items=30, trainer={"epochs": 3})
    started = subprocess.run(
        [PREFECT, "deployment", "run", "training-run/potato", "--param", f"config={config}",
         "--param", "backend=local"],
        env=_env(), capture_output=True, text=True, timeout=120,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    store = store_of(config)
    wait_for(lambda: store.list_runs(), 120, "the flow to create its run in the store")
    run = wait_for_state(store, 1, ("succeeded", "failed", "cancelled"), timeout=180)
    assert (run.state, run.backend, run.error) == ("succeeded", "local", None), prefect_worker.read_text()
    assert run.scores["sentiment"]["n"] > 0
    seen = flow_run(run.prefect_flow_run_id)
    key = project_key_of(load_config(config))
    assert seen.name == "run-1"
    assert {"potato", f"project:{key}", "backend:local", "trainer:hf-text-classification"} <= set(seen.tags)


def _deployment_project(tmp_path: Path, **model_training) -> Path:
    return tiny_project(tmp_path, grace_seconds=5, prefect_deployment="training-run/potato",
                        trainer={"epochs": 100000}, **model_training)


def test_cancelling_a_deployment_run_in_prefect_cancels_it_in_potato(prefect_worker, tmp_path):
    config = _deployment_project(tmp_path)
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    try:
        run = wait_for_training(store, 1, timeout=180)
        cancel = subprocess.run([PREFECT, "flow-run", "cancel", run.prefect_flow_run_id], env=_env(),
                                capture_output=True, text=True, timeout=120)
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        run = wait_for_state(store, 1, ("cancelled", "failed", "succeeded"), timeout=60)
    finally:
        cli.wait(timeout=120)
    steps = [e.data["text"] for e in store.events(1) if e.kind == "step"]
    assert "waiting for a Prefect worker on pool potato-training" in steps
    assert (run.state, run.error) == ("cancelled", "Cancelled in Prefect"), prefect_worker.read_text()
    state = final_state(run.prefect_flow_run_id)
    assert (state.type.value, state.message) == ("CANCELLED", "Run 1 was cancelled in Prefect; its worker was stopped")
    assert ("The flow run was cancelled in Prefect: cancelling run 1 as Cancel run does "
            "(SIGTERM, then SIGKILL after 5 s)") in (run_dir_of(config, 1) / "run.log").read_text()
    done = [e for e in store.events(1) if e.kind == "done"]
    assert done and done[-1].data["status"] == "cancelled"  # the worker got SIGTERM, not SIGKILL
    wait_for(lambda: not process_alive(run.flow_pid), 30, "the flow process to exit")
    assert not process_alive(run.worker_pid) and processes_matching(str(tmp_path)) == []


def test_cancelling_a_deployment_run_in_potato_cancels_its_flow_run(prefect_worker, tmp_path):
    config = _deployment_project(tmp_path)
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    try:
        run = wait_for_training(store, 1, timeout=180)
        cancel = potato("training", "cancel", str(config), "1")
        assert cancel.stdout == "Run 1: cancel requested; the worker gets SIGTERM, then SIGKILL after 5 s\n"
        run = wait_for_state(store, 1, ("cancelled", "failed", "succeeded"), timeout=60)
    finally:
        cli.wait(timeout=120)
    assert (run.state, run.error) == ("cancelled", f"Cancelled with potato training cancel, by the account {getuser()}")
    state = final_state(run.prefect_flow_run_id)
    assert (state.type.value, state.message) == (
        "CANCELLED", "Run 1 was cancelled in Potato (Cancel run); its worker was stopped")
    wait_for(lambda: not process_alive(run.flow_pid), 30, "the flow process to exit")
    assert not process_alive(run.worker_pid) and processes_matching(str(tmp_path)) == []


@pytest.fixture(scope="module")
def unserved_deployment(deployment) -> str:
    """A deployment on a work pool no worker serves."""
    from prefect.client.orchestration import get_client

    from deployments.create import ENTRYPOINT, ensure_work_pool

    ensure_work_pool("potato-unserved")
    with get_client(sync_client=True) as client:
        flow_id = client.read_deployment_by_name(deployment).flow_id
        client.create_deployment(flow_id=flow_id, name="unserved", work_pool_name="potato-unserved",
                                 entrypoint=ENTRYPOINT)
    return "training-run/unserved"


def test_a_run_no_worker_starts_fails_naming_the_pool(unserved_deployment, tmp_path):
    config = tiny_project(tmp_path, n_items=20, max_wall_seconds=6, prefect_deployment=unserved_deployment)
    done = potato("training", "run", str(config), timeout=120)

    message = ("No Prefect worker started run 1 within 6 seconds of its queueing on work pool 'potato-unserved' "
               "(model_training.max_wall_seconds); start one on the annotation server's host: "
               "prefect worker start --pool potato-unserved")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"Run 1 failed: {message}" in done.stdout
    store = store_of(config)
    run = store.get_run(1)
    assert (run.state, run.error, run.flow_pid) == ("failed", message, None)
    assert "waiting for a Prefect worker on pool potato-unserved" in [
        e.data["text"] for e in store.events(1) if e.kind == "step"]
    assert 6 <= run.finished_at - run.started_at < 6 + 5
    # Cancelled in Prefect, so a worker that comes later does not start it.
    assert final_state(run.prefect_flow_run_id).type.value == "CANCELLED"


def test_cancelling_a_run_no_worker_started_ends_it_at_once(unserved_deployment, tmp_path):
    config = tiny_project(tmp_path, n_items=20, prefect_deployment=unserved_deployment)
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    try:
        run = wait_for(lambda: (r := store.get_run(1) if store.list_runs() else None) and r.prefect_flow_run_id and r,
                       60, "the run to be handed to the work pool")
        potato("training", "cancel", str(config), "1")
        run = wait_for_state(store, 1, ("cancelled",), timeout=10)
    finally:
        cli.wait(timeout=60)
    assert run.error == "Cancelled before a Prefect worker started it"
    state = final_state(run.prefect_flow_run_id, timeout=10)
    assert (state.type.value, state.message) == (
        "CANCELLED", "Cancelled in Potato before a Prefect worker started it")


def test_a_cron_schedule_retrains_a_project_on_its_backend(prefect_worker, tmp_path):
    from prefect.client.orchestration import get_client

    config = tiny_project(tmp_path, n_items=30, trainer={"epochs": 3})
    key = project_key_of(load_config(config))
    created = subprocess.run([sys.executable, "-m", "deployments.create", "--config", str(config), "--cron", "* * * * *"],
                             cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert created.returncode == 0, created.stdout + created.stderr
    assert created.stdout == (
        f"Deployment training-run/{key} runs {config} on the schedule '* * * * *' (UTC), on work pool 'potato-training'\n"
        "Start a worker on the annotation server's host with:\n  prefect worker start --pool potato-training\n")
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(f"training-run/{key}")
    try:
        assert deployment.parameters == {"config": str(config)}
        assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in deployment.schedules] == [
            ("* * * * *", "UTC", True)]
        store = store_of(config)
        wait_for(lambda: store.list_runs(), 150, "the schedule to start a run")
        with get_client(sync_client=True) as client:  # one run is enough
            client.pause_deployment(deployment.id)
        run = wait_for_state(store, 1, ("succeeded", "failed", "cancelled"), timeout=180)
    finally:
        with get_client(sync_client=True) as client:
            client.delete_deployment(deployment.id)
    assert (run.state, run.backend, run.error) == ("succeeded", "local", None), prefect_worker.read_text()
    assert run.trigger == "schedule"
    assert f"Run 1 was started by a schedule of the deployment training-run/{key}" in (
        run_dir_of(config, 1) / "run.log").read_text()
    seen = flow_run(run.prefect_flow_run_id)
    assert seen.auto_scheduled and seen.name == "run-1" and f"project:{key}" in seen.tags
    assert len(store.list_runs()) == 1
