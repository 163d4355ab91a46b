"""The ssh backend against a real OpenSSH sshd, logging in as an unprivileged user.

The "GPU host" is this machine seen through sshd as the user ``potatotest``;
its interpreter is this repository's venv (torch on the CPU), and a fake
``nvidia-smi`` stands in for GPUs where a test installs one.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

from tests.support.potato_project import make_project
from tests.support.runs import (
    assert_private, potato, potato_background, potato_watching, run_dir_of, store_of, wait_for, wait_for_state,
    wait_for_training,
)
from tests.support.remote_host import assert_host_clean, host_processes

pytestmark = [pytest.mark.sshd, pytest.mark.prefect, pytest.mark.training]

BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / "python3")  # no torch there
OLD_PYTHON = "/root/.pyenv/versions/3.6.15/bin/python3"
GPUS = [
    {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920, "memory_used": 80000,
     "memory_free": 1920, "utilization_gpu": 2, "pci_bus_id": "00000000:07:00.0", "compute_cap": "8.0"},
    {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920, "memory_used": 79000,
     "memory_free": 2920, "utilization_gpu": 97, "pci_bus_id": "00000000:0F:00.0", "compute_cap": "8.0"},
]


def ssh_project(root: Path, model: Path, host: str, *, trainer=None, **backend) -> Path:
    options = {"model": str(model), "epochs": 10, "learning_rate": 3e-3, "batch_size": 8, "max_length": 32}
    options.update(trainer or {})
    entry = {"type": "ssh", "host": host, **{k: str(v) if isinstance(v, Path) else v for k, v in backend.items()}}
    mt = {
        "enabled": True, "backend": "gpu-server", "max_wall_seconds": 600,
        "writeback": {"schemas": ["sentiment"], "include_unlabeled": True, "min_confidence": 0.5},
        "trainers": {"hf-text-classification": options},
        "backends": {"gpu-server": entry},
    }
    for key in ("grace_seconds", "max_wall_seconds", "heartbeat_timeout_s"):
        if key in backend:
            mt[key] = entry.pop(key)
    return make_project(root, n_items=60, labeled_fraction=0.9, model_training=mt)


def remote_job_dir(config: Path, run_id: int) -> Path:
    log = (run_dir_of(config, run_id) / "run.log").read_text()
    return Path(re.search(r"Started the agent in (\S+) on", log).group(1))


def test_an_ssh_run_trains_on_the_host_and_brings_everything_back(
        prefect_api, sshd_service, ssh_user_config, shared_model, tmp_path):
    config = ssh_project(tmp_path, shared_model, ssh_user_config, python=sshd_service.python)
    store = store_of(config)
    shutil.rmtree(Path(sshd_service.user_home) / ".cache/potato-training/code", ignore_errors=True)  # a new host
    seen_cmdlines: set[str] = set()
    sockets: list[tuple[int, int]] = []

    def watch_host():  # what any account on a shared server could see during the run
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    seen_cmdlines.update(fh.read().decode(errors="replace").split("\0"))
            except OSError:
                pass
        for sock in Path("/tmp").glob("potato-1-*.sock"):
            try:
                st = sock.stat()
                sockets.append((stat.S_IMODE(st.st_mode), st.st_uid))
            except OSError:
                pass

    done = potato_watching(watch_host, "training", "run", str(config), interval=0.05)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Run 1 queued: hf-text-classification on sentiment, runs on gpu-server (ssh to " in done.stdout
    run = store.get_run(1)
    assert (run.state, run.backend) == ("succeeded", "gpu-server")
    assert run.host_python == "3.11.7" and run.gpu.startswith("CPU (")  # what the worker reported last
    directory = run_dir_of(config, 1)
    assert (directory / "artifacts/sentiment/config.json").exists()
    assert run.artifact_uri == str(directory / "artifacts")
    predictions = (directory / "predictions.jsonl").read_text().splitlines()
    assert len(predictions) == 60 and run.scores["sentiment"]["accuracy"] == 1.0
    log = (directory / "run.log").read_text()
    assert f"{ssh_user_config}: Python 3.11.7 ({sshd_service.python})" in log
    assert "The run uses the CPU (the host has no GPU)" in log
    assert "Copied Potato's code" in log
    steps = [e.data["text"] for e in store.events(1) if e.kind == "step"]  # the step row, as the Training page shows it
    host = ssh_user_config
    assert f"copying Potato's code to {host}" in steps and f"waiting for the agent on {host}" in steps
    assert steps.index(f"copying Potato's code to {host}") < steps.index(f"waiting for the agent on {host}")
    assert re.fullmatch(rf"copying the model from {re.escape(host)}: 0\.\d of 0\.\d MB", steps[-1])
    assert (directory / "agent.log").read_text().strip()

    # The socket: 0600, owned by the login user; the token: on no command line.
    assert sockets and set(sockets) == {(0o600, pwd.getpwnam(sshd_service.user).pw_uid)}
    leaked = [w for w in seen_cmdlines if hashlib.sha256(w.encode()).hexdigest() == run.run_token_hash]
    assert leaked == [] and run.run_token_hash
    assert_host_clean(sshd_service, config)
    assert_private(config.parent / "annotation_output/training")  # the copied model included

    # The second run finds the code there and copies none.
    again = potato("training", "run", str(config))
    assert again.returncode == 0, again.stdout + again.stderr
    code_events = [e.data for e in store.events(2) if e.kind == "code"]
    assert code_events == [{"hash": code_events[0]["hash"], "bytes_sent": 0}]
    assert "already has this version of Potato's code" in (run_dir_of(config, 2) / "run.log").read_text()
    assert_host_clean(sshd_service, config)


def test_check_reports_python_gpus_and_the_choice(sshd_service, ssh_user_config, shared_model, fake_gpus, tmp_path):
    fake_gpus(GPUS)
    config = ssh_project(tmp_path, shared_model, ssh_user_config, python=BASE_PYTHON, min_free_gpu_mb=2000)
    done = potato("training", "check", "gpu-server", str(config))
    lines = done.stdout.splitlines()
    assert lines[0] == f"gpu-server: ssh to {ssh_user_config}"
    assert lines[1].startswith("Python 3.11.7 (")
    assert lines[2] == "GPU 0: NVIDIA A100-SXM4-80GB, 1920 of 81920 MB free, 2% busy"
    assert lines[3] == "GPU 1: NVIDIA A100-SXM4-80GB, 2920 of 81920 MB free, 97% busy"
    assert lines[4] == "A run would take GPU 1 (NVIDIA A100-SXM4-80GB) (most free memory: 2920 MB)"
    assert lines[5].startswith(f"Training packages missing from {BASE_PYTHON}: torch, transformers, peft")
    assert done.returncode == 1  # the packages are missing: a run could not start
    as_json = json.loads(potato("training", "check", "gpu-server", str(config), "--json").stdout)
    assert as_json["would_use"] == [1] and as_json["ok"] is False


@pytest.mark.parametrize("case", ["unknown host key", "connection refused", "host not found"])
def test_connection_failures_name_the_fix(sshd_service, ssh_user_config, shared_model, tmp_path, case):
    import socket

    if case == "unknown host key":  # the same sshd under a name known_hosts has no key for
        host, backend = "localhost", dict(port=sshd_service.port, user=sshd_service.user,
                                          identity_file=str(sshd_service.identity_file))
        expected = ("ssh to localhost failed: Host key verification failed. Fix: the host's key is not in "
                    "known_hosts: run `ssh localhost true` once")
    elif case == "connection refused":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # nothing listens there once the socket closes
        host, backend = "127.0.0.1", dict(port=port)
        expected = "ssh to 127.0.0.1 failed: Connection refused. Fix: no ssh server listens there"
    else:
        host, backend = "nowhere.invalid", {}
        expected = "ssh to nowhere.invalid failed: host not found. Fix: check the backend's host"
    config = ssh_project(tmp_path, shared_model, host, **backend)
    done = potato("training", "check", "gpu-server", str(config))
    assert done.returncode == 1
    assert done.stdout.splitlines()[1].startswith(expected), done.stdout


def test_no_kernels_are_marked_and_refused(sshd_service, ssh_user_config, shared_model, fake_gpus, tmp_path):
    fake_gpus(GPUS)  # the host's torch is a CPU build: it has kernels for no GPU
    config = ssh_project(tmp_path, shared_model, ssh_user_config, python=sshd_service.python)
    done = potato("training", "check", "gpu-server", str(config))
    assert "GPU 0: NVIDIA A100-SXM4-80GB, 1920 of 81920 MB free, 2% busy (torch there has no kernels for it)" in done.stdout
    assert "A run could not start: This host's torch has no kernels for any of its GPUs" in done.stdout
    assert done.returncode == 1


@pytest.mark.parametrize("case", ["wrong key", "missing interpreter", "old interpreter", "no free GPU",
                                  "missing trainer package", "no kernels"])
def test_spec_failures_end_the_run_with_their_message(prefect_api, sshd_service, ssh_user_config, shared_model,
                                                     fake_gpus, tmp_path, case):
    host = ssh_user_config
    if case == "wrong key":
        backend = dict(port=sshd_service.port, user=sshd_service.user,
                       identity_file=str(sshd_service.wrong_identity_file))
        host, expected = "127.0.0.1", "ssh to 127.0.0.1 failed: Permission denied"
    elif case == "missing interpreter":
        backend, expected = dict(python="/opt/conda/bin/python3"), f"/opt/conda/bin/python3 was not found on {host}"
    elif case == "old interpreter":
        if not os.path.exists(OLD_PYTHON):
            pytest.skip(f"{OLD_PYTHON} is not on this machine")
        backend = dict(python=OLD_PYTHON)
        expected = f"{OLD_PYTHON} on {host} is Python 3.6.15; Potato's agent needs Python 3.8 or newer"
    elif case == "no free GPU":
        fake_gpus(GPUS)
        backend, expected = dict(python=BASE_PYTHON, min_free_gpu_mb=4000), "No GPU has 4000 MB free"
    elif case == "missing trainer package":
        backend, expected = dict(python=BASE_PYTHON), "Trainer 'hf-text-classification' could not be imported"
    else:
        fake_gpus(GPUS)
        backend, expected = dict(python=sshd_service.python), "This host's torch has no kernels for any of its GPUs"
    config = ssh_project(tmp_path, shared_model, host, **backend)
    done = potato("training", "run", str(config))
    assert done.returncode == 1
    run = store_of(config).get_run(1)
    assert run.state == "failed" and run.error.startswith(expected), run.error
    assert f"Run 1 failed: {expected}" in done.stdout
    assert_host_clean(sshd_service, config)


def test_a_failing_remote_worker_says_why(prefect_api, sshd_service, ssh_user_config, shared_model, tmp_path):
    config = ssh_project(tmp_path, shared_model, ssh_user_config, python=sshd_service.python)
    # An option the trainer refuses is refused before a run is queued, naming it.
    refused = potato("training", "run", str(config), "--option", "epochs=-1")
    assert refused.returncode == 1 and store_of(config).count_runs() == 0
    assert "epochs must be a positive integer, got -1" in refused.stdout + refused.stderr
    # A model only the host could look for fails there, and the run says what the worker said.
    missing = "/nonexistent/model-dir"
    done = potato("training", "run", str(config), "--option", f"model={missing}")
    assert done.returncode == 1
    error = store_of(config).get_run(1).error
    assert missing in error, error
    assert f"Run 1 failed: {error.splitlines()[0]}" in done.stdout
    assert_host_clean(sshd_service, config)


def test_cancel_reaches_the_agent_and_leaves_nothing_on_the_host(
        prefect_api, sshd_service, ssh_user_config, shared_model, tmp_path):
    config = ssh_project(tmp_path, shared_model, ssh_user_config, python=sshd_service.python,
                         grace_seconds=5, trainer={"epochs": 100000})
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    try:
        wait_for_training(store, 1)
        asked = time.monotonic()
        assert potato("training", "cancel", str(config), "1").returncode == 0
        wait_for_state(store, 1, ("cancelled",), timeout=30)
        took = time.monotonic() - asked
    finally:
        cli.wait(timeout=60)
    assert took < 5 + 5
    assert [e.data["status"] for e in store.events(1) if e.kind == "done"] == ["cancelled"]
    assert_host_clean(sshd_service, config)


def test_max_wall_seconds_stops_an_ssh_run(prefect_api, sshd_service, ssh_user_config, shared_model, tmp_path):
    config = ssh_project(tmp_path, shared_model, ssh_user_config, python=sshd_service.python,
                         max_wall_seconds=12, grace_seconds=3, trainer={"epochs": 100000})
    done = potato("training", "run", str(config))
    assert done.returncode == 1
    message = "The run was stopped after 12 seconds: it reached model_training.max_wall_seconds (12)"
    assert store_of(config).get_run(1).error == message
    assert_host_clean(sshd_service, config)


def test_a_silent_agent_fails_the_run_and_keeps_its_log(
        prefect_api, sshd_service, ssh_user_config, shared_model, tmp_path):
    config = ssh_project(tmp_path, shared_model, ssh_user_config, python=sshd_service.python,
                         heartbeat_timeout_s=6, grace_seconds=2, trainer={"epochs": 100000})
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    try:
        wait_for_training(store, 1)
        agents = [line for line in host_processes(sshd_service) if "potato.training.agent" in line]
        os.kill(int(agents[0].split(":")[0]), signal.SIGSTOP)  # a hung agent: alive, silent
        run = wait_for_state(store, 1, ("failed",), timeout=40)
    finally:
        cli.wait(timeout=60)
    assert run.error == "No word from the agent on gpu-server for 6 seconds"
    assert "potato-agent: worker started (pid" in (run_dir_of(config, 1) / "agent.log").read_text()
    for line in host_processes(sshd_service):  # a stopped process cannot act on its stdin closing
        os.kill(int(line.split(":")[0]), signal.SIGCONT)
    assert_host_clean(sshd_service, config)



def test_a_stalled_copy_fails_with_predictions_saved(
        prefect_api, sshd_service, ssh_user_config, shared_model, tmp_path):
    config = ssh_project(tmp_path, shared_model, ssh_user_config, python=sshd_service.python,
                         copy_stall_timeout_s=3, trainer={"epochs": 30})
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    stopped = []
    try:
        log = run_dir_of(config, 1) / "run.log"
        wait_for(lambda: log.exists() and "Started the agent in" in log.read_text(), 60, "the agent to start")
        artifacts = remote_job_dir(config, 1) / "artifacts"
        wait_for(artifacts.parent.exists, 10, "the remote job directory")
        artifacts.mkdir(exist_ok=True)
        with open(artifacts / "big.bin", "wb") as fh:  # 300 MB that take a while to stream
            fh.truncate(300 * 1024 * 1024)
        # The host user's own file, whatever umask this process has (once 077: the copy then failed on
        # "Permission denied" before it could stall).
        for path in (artifacts, artifacts / "big.bin"):
            shutil.chown(path, sshd_service.user)

        def stop_the_copy():
            copies = [line for line in host_processes(sshd_service) if "big.bin" in line]
            for line in copies:
                os.kill(int(line.split(":")[0]), signal.SIGSTOP)
                stopped.append(int(line.split(":")[0]))
            return copies

        wait_for(stop_the_copy, 120, "the artifact copy to start", interval=0.005)
        run = wait_for_state(store, 1, ("failed",), timeout=30)
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        cli.wait(timeout=60)
    assert run.error.startswith(f"The copy from {ssh_user_config} sent nothing for 3 s")
    directory = run_dir_of(config, 1)
    assert len((directory / "predictions.jsonl").read_text().splitlines()) == 60  # already saved
    assert not (directory / "artifacts").exists() and not (directory / "artifacts.partial").exists()
    assert_host_clean(sshd_service, config)


def test_packages_build_the_venv_once(prefect_api, sshd_service, ssh_user_config, shared_model, tmp_path):
    config = ssh_project(tmp_path, shared_model, ssh_user_config, python=BASE_PYTHON, packages=["six"])
    first = potato("training", "run", str(config), timeout=600)
    # The venv sees the base interpreter's packages only; that one has no torch, so the run fails —
    # but only after the env was built, once.
    assert "could not be imported (missing module: torch)" in first.stdout
    envs = list((Path(sshd_service.user_home) / ".cache/potato-training/envs").iterdir())
    assert len(envs) == 1 and (envs[0] / "bin/python").exists()
    built = envs[0].stat().st_mtime
    second = potato("training", "run", str(config), timeout=600)
    assert "could not be imported (missing module: torch)" in second.stdout
    assert [p.name for p in envs[0].parent.iterdir()] == [envs[0].name]  # no .tmp- leftovers
    assert envs[0].stat().st_mtime == built
    log = (run_dir_of(config, 2) / "run.log").read_text()
    assert f"Using the venv {envs[0]}" in log
    assert_host_clean(sshd_service, config)
