"""`potato training check` for a slurm backend, logging in to a real sshd as the login node."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.potato_project import make_project
from tests.support.runs import potato

pytestmark = [pytest.mark.sshd, pytest.mark.slurm]

BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / "python3")


def _project(root: Path, host: str, sshd_service, **backend) -> Path:
    entry = {"type": "slurm", "host": host, "python": BASE_PYTHON, "job_python": str(sshd_service.python),
             "remote_dir": str(sshd_service.shared_dir / "potato-training"), "gres": "gpu:1", **backend}
    return make_project(root, n_items=4, model_training={"enabled": True, "backends": {"cluster": entry}})


def test_check_reports_the_login_node(slurm_service, sshd_service, ssh_user_config, tmp_path):
    done = potato("training", "check", "cluster", str(_project(tmp_path, ssh_user_config, sshd_service)))
    lines = done.stdout.splitlines()
    assert lines[0] == f"cluster: slurm on {ssh_user_config}"
    assert lines[1] == f"Login node: Python 3.11.7 ({BASE_PYTHON}), for the agent"
    assert lines[2] == "sbatch, squeue, scancel: on PATH (/usr/bin)"
    assert lines[3] == "scontrol: on PATH"
    assert lines[4].endswith("not node-local")
    assert lines[5].startswith(f"Jobs run {sshd_service.python} on the compute nodes")
    assert lines[6] == "GPUs: gpu:1 per job"
    assert done.returncode == 0


def test_a_login_node_without_sbatch_on_path_is_named(sshd_service, ssh_user_config, tmp_path):
    config = _project(tmp_path, ssh_user_config, sshd_service, env={"PATH": "/nonexistent"})
    done = potato("training", "check", "cluster", str(config))
    assert done.returncode == 1
    assert f"{ssh_user_config} has no sbatch on PATH, so it cannot submit jobs. Fix: " in done.stdout
    assert f"{ssh_user_config} has no squeue on PATH" in done.stdout
