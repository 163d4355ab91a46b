"""An annotator of the real Potato 2.12.1 plants labels on ids that are no items; runs succeed on every backend.

2.12.1's ``POST /submit_annotation`` saves a label on any ``instance_id`` it
is sent. Here one annotator, through that very route, labels a lone
surrogate (``"\\ud83d"``) and a 200 kB id. A run on each backend — local,
ssh (real sshd), slurm (real SLURM behind it), agent (``potato start`` and a
real polling agent) — then succeeds, and its run log names what it ignored
in lines of bounded length. The tiny model (tests/support/tiny_model.py) and
the session's services are shared; 2.12.1 runs only while the ids are planted.

Cost (2 cores, loaded by other sessions): about three minutes, most of it the ssh, SLURM and agent
orchestration of four tiny runs; 2.12.1 starts once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.support.potato212 import Annotator, Potato212Server
from tests.support.potato_project import make_project
from tests.support.runs import POTATO, free_port, potato, run_dir_of, store_of, wait_for, wait_for_state

pytestmark = [pytest.mark.potato212, pytest.mark.prefect, pytest.mark.training, pytest.mark.sshd,
              pytest.mark.slurm]

LONE_SURROGATE = "\ud83d"
LONG_ID = "y" * 200_000
# Every line of a run log stays under this, whatever ids annotators planted.
LINE_BOUND = 1000
IGNORED = ("annotation_output/mallory/user_state.json: 2 labels by mallory on 2 ids that are not items of this "
           f"project were ignored: '{'y' * 80}…' (200000 characters), '\\ud83d'")


@pytest.fixture(scope="module")
def planted(potato212, sshd_service, shared_model, tmp_path_factory) -> Path:
    """A project whose annotator mallory planted the two ids through 2.12.1's /submit_annotation."""
    root = tmp_path_factory.mktemp("planted")
    options = {"model": str(shared_model), "epochs": 1, "learning_rate": 3e-3, "batch_size": 8, "max_length": 32}
    config_path = make_project(root, n_items=60, labeled_fraction=0.9, model_training={
        "enabled": False, "max_wall_seconds": 600, "grace_seconds": 5,
        "writeback": {"schemas": ["sentiment"], "include_unlabeled": True},
        "trainers": {"hf-text-classification": options},
        "backends": {
            "gpu-server": {"type": "ssh", "host": "HOST", "python": str(sshd_service.python)},
            "cluster": {"type": "slurm", "host": "HOST", "python": str(sshd_service.python),
                        "job_python": str(sshd_service.python), "poll_interval_s": 1,
                        "remote_dir": str(sshd_service.shared_dir / "potato-training")},
            "lab-workstation": {"type": "agent", "queue_timeout_s": 300}}})
    config = yaml.safe_load(config_path.read_text())
    config.update(user_config={"allow_all_users": True}, require_password=False)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    server = Potato212Server(potato212, config_path, root / "potato212.log").start()
    try:
        mallory = Annotator(server, "mallory")
        for item_id in (LONE_SURROGATE, LONG_ID):
            answer = json.loads(mallory._post_json("/submit_annotation", {
                "instance_id": item_id, "annotations": {"sentiment": {"positive": "true"}}}))
            assert answer["status"] == "success", answer
    finally:
        server.stop()
    state = (root / "annotation_output" / "mallory" / "user_state.json").read_text()
    assert '"\\ud83d"' in state and LONG_ID in state  # as 2.12.1 wrote them
    return config_path


def _with_host(config_path: Path, host: str) -> None:
    """Point the ssh and slurm backends at this test's ssh alias (it is per test)."""
    config_path.write_text(re.sub(r"host: \S+", f"host: {host}", config_path.read_text()))


def _assert_ran_and_named_what_it_ignored(config_path: Path, run_id: int, backend: str) -> None:
    run = wait_for_state(store_of(config_path), run_id, ("succeeded", "failed", "cancelled"), timeout=300)
    log = (run_dir_of(config_path, run_id) / "run.log").read_text(encoding="utf-8")
    assert (run.state, run.backend) == ("succeeded", backend), run.error or log[-3000:]
    assert IGNORED in log
    assert max(map(len, log.splitlines())) < LINE_BOUND


@pytest.mark.parametrize("backend", ["local", "gpu-server", "cluster"])
def test_a_run_succeeds_beside_planted_ids(planted, backend, ssh_user_config, slurm_service, prefect_api):
    _with_host(planted, ssh_user_config)
    done = potato("training", "run", str(planted), "--backend", backend)
    run_id = int(re.search(r"Run (\d+) queued", done.stdout).group(1))
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_ran_and_named_what_it_ignored(planted, run_id, backend)


def test_an_agent_run_succeeds_beside_planted_ids(planted, prefect_api, tmp_path):
    registered = potato("training", "register", "lab-workstation", str(planted))
    token = registered.stdout.splitlines()[2].strip()
    port = free_port()
    with open(tmp_path / "server.log", "wb") as log:
        server = subprocess.Popen([POTATO, "start", str(planted), "--port", str(port)], stdout=log,
                                  stderr=subprocess.STDOUT, env=dict(os.environ, HF_HUB_OFFLINE="1"),
                                  start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(url, server), 120, "potato start to serve")
        queued = potato("training", "run", str(planted), "--backend", "lab-workstation", "--detach")
        run_id = int(re.search(r"Run (\d+) queued", queued.stdout).group(1))
        agent = subprocess.run(
            [POTATO, "training", "agent", "--server", url, "--backend", "lab-workstation", "--once",
             "--workdir", str(tmp_path / "agent-work")],
            env=dict(os.environ, POTATO_TRAINING_TOKEN=token, HF_HUB_OFFLINE="1"), capture_output=True, text=True,
            timeout=300)
        assert agent.returncode == 0, agent.stderr
        _assert_ran_and_named_what_it_ignored(planted, run_id, "lab-workstation")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def _answers(url: str, server: subprocess.Popen) -> bool:
    assert server.poll() is None, "potato start exited"
    try:
        return urllib.request.urlopen(url + "/admin/training/login", timeout=2).status == 200
    except OSError:
        return False
