"""The "GPU host" of the ssh and slurm tests as the annotation server cannot see it: its processes, its files."""

from __future__ import annotations

import os
import pwd
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


def host_processes(user: str) -> list[str]:
    """Command lines of the host user's Potato processes (agent, worker, tar)."""
    uid = pwd.getpwnam(user).pw_uid
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "potato.training" in cmdline or "tar cf" in cmdline or cmdline.startswith("cat "):
            found.append(f"{entry}: {cmdline}")
    return found


def assert_host_clean(sshd_service, remote_dir: Path | None = None) -> None:
    """No Potato process of the login user, no job directory, no socket left on the host."""
    wait_for(lambda: not host_processes(sshd_service.user), 15,
             f"the host to have no Potato processes left: {host_processes(sshd_service.user)}")
    jobs = (remote_dir or Path(sshd_service.user_home) / ".cache/potato-training") / "jobs"
    assert not jobs.exists() or list(jobs.iterdir()) == []
    assert not list(Path("/tmp").glob("potato-*.sock"))


