"""The slurm backend against a real single-node SLURM, through a real sshd as its login node."""

from __future__ import annotations

import re

import pytest

from tests.support.remote_host import assert_host_clean
from tests.support.potato_project import make_project
from tests.support.runs import (
    potato, potato_background, run_dir_of, store_of, wait_for, wait_for_state,
    wait_for_training,
)


pytestmark = [pytest.mark.sshd, pytest.mark.slurm, pytest.mark.prefect, pytest.mark.training]


def slurm_project(root, model, host, sshd_service, *, trainer=None, **backend):
    options = {"model": str(model), "epochs": 10, "learning_rate": 3e-3, "batch_size": 8, "max_length": 32}
    options.update(trainer or {})
    entry = {"type": "slurm", "host": host, "python": str(sshd_service.python),
             "job_python": str(sshd_service.python), "remote_dir": str(sshd_service.shared_dir / "potato-training"),
             "gres": "gpu:1", "poll_interval_s": 1, **backend}
    mt = {"enabled": True, "backend": "cluster", "max_wall_seconds": 600, "grace_seconds": 5,
          "writeback": {"schemas": ["sentiment"], "include_unlabeled": True, "min_confidence": 0.5},
          "trainers": {"hf-text-classification": options}, "backends": {"cluster": entry}}
    return make_project(root, n_items=60, labeled_fraction=0.9, model_training=mt)


def user_jobs(slurm_service) -> str:
    return slurm_service.run("squeue", "--noheader", "--user", slurm_service.user, "--format", "%i %T").stdout.strip()


def job_id_of(config) -> str:
    log = (run_dir_of(config, 1) / "run.log").read_text()
    return re.search(r"Submitted SLURM job (\d+)", log).group(1)


def test_a_slurm_run_submits_the_worker_and_brings_everything_back(
        prefect_api, slurm_service, sshd_service, ssh_user_config, shared_model, tmp_path):
    config = slurm_project(tmp_path, shared_model, ssh_user_config, sshd_service)
    done = potato("training", "run", str(config))
    assert done.returncode == 0, done.stdout + done.stderr
    run = store_of(config).get_run(1)
    assert (run.state, run.backend) == ("succeeded", "cluster")
    log = (run_dir_of(config, 1) / "run.log").read_text()
    job = job_id_of(config)
    assert f"Submitted SLURM job {job} with --gres=gpu:1" in log
    assert re.search(rf"SLURM job {job}: RUNNING on \S+", log)
    assert (run_dir_of(config, 1) / "artifacts/sentiment/config.json").exists()
    assert run.scores["sentiment"]["accuracy"] == 1.0
    assert user_jobs(slurm_service) == ""
    assert_host_clean(sshd_service, config, sshd_service.shared_dir / "potato-training")


def test_cancel_scancels_the_job(prefect_api, slurm_service, sshd_service, ssh_user_config, shared_model,
                                 tmp_path):
    config = slurm_project(tmp_path, shared_model, ssh_user_config, sshd_service, trainer={"epochs": 100000})
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    try:
        wait_for_training(store, 1)
        assert potato("training", "cancel", str(config), "1").returncode == 0
        wait_for_state(store, 1, ("cancelled",), timeout=40)
    finally:
        cli.wait(timeout=60)
    wait_for(lambda: user_jobs(slurm_service) == "", 30, "the job to leave the queue")
    assert [e.data["status"] for e in store.events(1) if e.kind == "done"] == ["cancelled"]
    assert_host_clean(sshd_service, config, sshd_service.shared_dir / "potato-training")





def test_the_job_never_sees_the_agents_token(slurm_service, tmp_path, monkeypatch):
    """An agent started with POTATO_TRAINING_TOKEN submits a job whose environment lacks it."""
    from potato.training.agent import worker_environment
    from potato.training.slurm import SlurmJob

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    job_python = tmp_path / "job_python"  # stands in for the interpreter: writes down what the job was given
    job_python.write_text('#!/bin/sh\nenv > "$3/env.txt"\necho 0 > "$3/exit_code"\n')
    job_python.chmod(0o755)
    for key, value in slurm_service.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("POTATO_TRAINING_TOKEN", "the-agents-token")
    monkeypatch.setenv("POTATO_SEEN_BY_THE_JOB", "yes")
    SlurmJob({"job_python": str(job_python)}, str(job_dir), 1, lambda note: None, env=worker_environment())
    wait_for(lambda: (job_dir / "exit_code").exists(), 60, "the job to run")
    environment = (job_dir / "env.txt").read_text()
    assert "POTATO_SEEN_BY_THE_JOB=yes" in environment  # the job does get the agent's environment…
    assert "POTATO_TRAINING_TOKEN" not in environment and "the-agents-token" not in environment  # …minus the token
