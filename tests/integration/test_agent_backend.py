"""The agent backend end to end: `potato start`, `potato training register`, the API, a real polling agent."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.request

import pytest

from potato.runs.tokens import default_server_url
from tests.support.runs import POTATO, potato, run_dir_of, store_of, tiny_project, wait_for, wait_for_state

pytestmark = [pytest.mark.prefect, pytest.mark.training]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def agent_project(tmp_path):
    return tiny_project(tmp_path, backend="lab-workstation",
                        backends={"lab-workstation": {"type": "agent", "queue_timeout_s": 60}})


@pytest.fixture
def server(prefect_api, agent_project, tmp_path):
    port = _free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    with open(tmp_path / "server.log", "wb") as log:
        process = subprocess.Popen([POTATO, "start", str(agent_project), "--port", str(port)], env=env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def up():
        try:
            return urllib.request.urlopen(url + "/admin/training/login", timeout=2).status == 200
        except OSError:
            assert process.poll() is None, (tmp_path / "server.log").read_text()
            return False

    wait_for(up, 60, "potato start to serve")
    yield url
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=60)


def _start_run(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url + "/admin/training/api/runs", data=json.dumps(body).encode(), method="POST",
        headers={"X-API-Key": "test-admin-key", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_registered_agent_claims_trains_and_reports(server, agent_project, tmp_path):
    check = potato("training", "check", "lab-workstation", str(agent_project))
    assert check.returncode == 1 and check.stdout.startswith("lab-workstation: no token issued yet\n")

    registered = potato("training", "register", "lab-workstation", str(agent_project))
    assert registered.returncode == 0
    token = registered.stdout.splitlines()[2].strip()
    assert registered.stdout == (
        "Token for backend 'lab-workstation' (shown once; registering again replaces it):\n\n"
        f"  {token}\n\nOn the training machine:\n\n  export POTATO_TRAINING_TOKEN={token}\n"
        f"  potato training agent --server {default_server_url()} --backend lab-workstation\n")

    status, body = _start_run(server, {"trainer": "hf-text-classification", "schemas": ["sentiment"],
                                       "backend": "nowhere"})
    assert status == 409 and "lab-workstation" in json.dumps(body)
    status, body = _start_run(server, {"trainer": "hf-text-classification", "schemas": ["sentiment"],
                                       "backend": "lab-workstation"})
    assert status in (200, 201, 202), body
    store = store_of(agent_project)
    wait_for(lambda: any(e.kind == "log" and "waiting for an agent" in e.data.get("message", "").lower()
                         for e in store.events(1)), 60, "the run to wait for an agent")

    workdir = tmp_path / "agent-work"
    agent = subprocess.run(
        [POTATO, "training", "agent", "--server", server, "--backend", "lab-workstation", "--once",
         "--workdir", str(workdir)],
        env=dict(os.environ, POTATO_TRAINING_TOKEN=token, HF_HUB_OFFLINE="1"),
        capture_output=True, text=True, timeout=300)
    assert agent.returncode == 0, agent.stderr
    run = wait_for_state(store, 1, ("succeeded", "failed", "cancelled"), timeout=60)
    assert (run.state, run.backend) == ("succeeded", "lab-workstation"), run.error
    assert run.scores["sentiment"]["accuracy"] == 1.0
    assert len((run_dir_of(agent_project, 1) / "predictions.jsonl").read_text().splitlines()) == 60
    # The model stayed on the agent's machine, where artifact_uri says.
    assert run.artifact_uri == f"{socket.gethostname()}:{workdir / 'jobs/1/artifacts'}"
    assert (workdir / "jobs/1/artifacts/sentiment/config.json").exists()
    record = potato("training", "check", "lab-workstation", str(agent_project))
    assert record.returncode == 0 and "last_seen: " in record.stdout and "never" not in record.stdout


def test_stopping_the_agent_stops_its_worker_and_fails_the_run_at_once(server, agent_project, tmp_path):
    from tests.support.runs import processes_matching, wait_for_training

    token = potato("training", "register", "lab-workstation", str(agent_project)).stdout.splitlines()[2].strip()
    status, _ = _start_run(server, {"trainer": "hf-text-classification", "schemas": ["sentiment"],
                                    "backend": "lab-workstation", "options": {"epochs": 100000}})
    assert status == 201
    workdir = tmp_path / "agent-work"
    with open(tmp_path / "agent.log", "wb") as log:
        agent = subprocess.Popen(
            [POTATO, "training", "agent", "--server", server, "--backend", "lab-workstation", "--workdir", str(workdir)],
            env=dict(os.environ, POTATO_TRAINING_TOKEN=token, HF_HUB_OFFLINE="1"), stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
    store = store_of(agent_project)
    try:
        wait_for_training(store, 1)
        os.kill(agent.pid, signal.SIGINT)  # Ctrl-C on the training machine
        assert agent.wait(timeout=60) == 0
        run = wait_for_state(store, 1, ("failed",), timeout=30)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert run.error == f"The agent on {socket.gethostname()} was stopped before the worker finished"
    assert processes_matching(str(workdir)) == []


def test_an_agent_run_fails_after_queue_timeout_without_an_agent(prefect_api, tmp_path):
    config = tiny_project(tmp_path, backend="lab-workstation",
                          backends={"lab-workstation": {"type": "agent", "queue_timeout_s": 3}})
    done = potato("training", "run", str(config))
    assert done.returncode == 1
    run = store_of(config).get_run(1)
    assert run.error.startswith("No agent asked for work on backend 'lab-workstation' within 3 s. Fix: start one")
