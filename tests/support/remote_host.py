"""The "GPU host" of the ssh and slurm tests as the annotation server cannot see it: its processes, its files."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.support.potato_project import item_text, true_label
from tests.support.runs import wait_for
from tests.support.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def shared_model():
    """The tiny model in a directory the ssh user can read (the trainer loads it on the host)."""
    directory = Path(tempfile.mkdtemp(prefix="potato-ssh-model-"))
    texts = [item_text(i, true_label(i)) for i in range(60)]
    build_tiny_model(directory / "model", texts)
    for path in [directory, *directory.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield directory / "model"
    shutil.rmtree(directory, ignore_errors=True)


def host_processes(sshd_service) -> list[str]:
    """Command lines of this test session's Potato processes on the host (agent, worker, its ONNX Runtime session, tar, cat).

    Only this session's: its sshd gives every remote process ``POTATO_TEST_SERVICES=<tag>``,
    and other engineers' sessions run their own runs on the same host user meanwhile.
    """
    uid = pwd.getpwnam(sshd_service.user).pw_uid
    tag = f"\0POTATO_TEST_SERVICES={sshd_service.tag}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if tag not in b"\0" + fh.read():
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "potato.training" in cmdline or "potato.training.trainers." in cmdline or cmdline.startswith(("tar ", "cat ")):
            found.append(f"{entry}: {cmdline}")
    return found


def assert_host_clean(sshd_service, config: Path, remote_dir: Path | None = None) -> None:
    """Nothing of the runs of *config* is left on the host: no process, no job directory, no socket.

    Job directories and sockets are the ones the runs' logs name: the default
    ``remote_dir`` and ``/tmp`` are shared with other sessions' runs. With
    *remote_dir* (a directory of this session's own), its ``jobs/`` must be empty too.
    """
    wait_for(lambda: not host_processes(sshd_service), 15,
             f"the host to have no Potato processes left: {host_processes(sshd_service)}")
    logs = "".join(p.read_text() for p in (config.parent / "annotation_output/training/runs").glob("*/run.log"))
    named = re.findall(r"Started the agent in (\S+) on ", logs) + re.findall(r"\(reverse forward (\S+)\)", logs)
    assert [path for path in named if os.path.lexists(path)] == []
    if remote_dir is not None:
        assert not (remote_dir / "jobs").exists() or list((remote_dir / "jobs").iterdir()) == []
