"""A GPU host that lies: its artifacts try to write files outside the run directory.

The host is the real sshd's unprivileged user; while a real ssh run trains,
the test (root, so "the attacker") plants a hostile tree in the run's remote
``artifacts/``: directory names with a newline and a tab that forged an
absolute and a ``..`` name in the old listing, a symlink out of the tree, a
FIFO and a setuid file. Nothing may land outside ``artifacts/``; each refused
entry is named in the run log; the trainer's own model still comes back.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.integration.test_ssh_backend import remote_job_dir, ssh_project
from tests.support.runs import potato_background, run_dir_of, store_of, wait_for, wait_for_state

pytestmark = [pytest.mark.sshd, pytest.mark.prefect, pytest.mark.training]


def _plant(artifacts: Path, user: str, victim: Path) -> None:
    """What a hostile host leaves in the job's artifacts/ (each trick named after what it forged)."""
    forged_absolute = artifacts / "x\n9000000\t" / str(victim).lstrip("/")
    forged_absolute.parent.mkdir(parents=True)
    forged_absolute.write_text("anything")
    payload = artifacts / str(victim).lstrip("/")  # what `cat artifacts//<victim>` read on the host
    payload.parent.mkdir(parents=True)
    payload.write_text("ssh-ed25519 AAAA attacker\n")
    dotdot = artifacts / "y\n9000000\t.." / "escape.txt"  # forged "../escape.txt"
    dotdot.parent.mkdir(parents=True)
    dotdot.write_text("anything")
    (artifacts.parent / "escape.txt").write_text("escaped\n")
    (artifacts / "passwd").symlink_to("/etc/passwd")
    (artifacts / "root").symlink_to("/")
    os.mkfifo(artifacts / "fifo")
    setuid = artifacts / "setuid-shell"
    setuid.write_bytes(b"#!/bin/sh\n")
    for path in [artifacts, *artifacts.rglob("*")]:
        os.chown(path, *_ids(user), follow_symlinks=False)
    setuid.chmod(0o4755)  # after chown, which clears it


def _ids(user: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


def test_hostile_artifact_names_write_nothing_outside_the_run(
        prefect_api, sshd_service, ssh_user_config, shared_model, tmp_path):
    config = ssh_project(tmp_path, shared_model, ssh_user_config, python=sshd_service.python,
                         trainer={"epochs": 5})  # planting takes well under the worker's start-up
    victim = tmp_path / "victim" / "authorized_keys"
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    directory = run_dir_of(config, 1)
    log = directory / "run.log"
    job = None
    try:
        wait_for(lambda: log.exists() and "Started the agent in" in log.read_text(), 120, "the agent to start")
        job = remote_job_dir(config, 1)
        artifacts = job / "artifacts"
        wait_for(job.exists, 10, "the remote job directory")
        artifacts.mkdir()
        _plant(artifacts, sshd_service.user, victim)
        run = wait_for_state(store, 1, ("succeeded", "failed", "cancelled"), timeout=180)
    finally:
        cli.wait(timeout=60)

    # Nothing outside artifacts/: not the forged absolute name, not the forged "..", no link, FIFO or setuid bit.
    assert not victim.exists() and not victim.parent.exists()
    assert not (directory / "escape.txt").exists()
    copied = directory / "artifacts"
    for path in copied.rglob("*"):
        mode = path.lstat().st_mode
        assert stat.S_ISREG(mode) or stat.S_ISDIR(mode), path
        assert not mode & (stat.S_ISUID | stat.S_ISGID), path
        assert os.path.realpath(path).startswith(str(copied) + os.sep)
    # The legitimate part of the tree came back: the model, and the payload under its own (relative) name.
    assert (copied / "sentiment/config.json").is_file()
    assert (copied / str(victim).lstrip("/")).read_text() == "ssh-ed25519 AAAA attacker\n"

    # Each refused entry is named in the run log, and why; it stays on the host.
    text = log.read_text()
    host = ssh_user_config
    for name, why in [
        ("x\\n9000000\\t/" + str(victim).lstrip("/"), "it holds a control character"),
        ("y\\n9000000\\t../escape.txt", "it holds a control character"),
        ("passwd", "it is a symbolic link"), ("root", "it is a symbolic link"),
        ("fifo", "it is a FIFO"), ("setuid-shell", "it has the setuid or setgid bit"),
    ]:
        line = f"Not copied from {host}: '{name}' in the artifacts, because {why}; it stays on the host in {job}/artifacts"
        assert line in text, (line, text)

    # The run itself is fine: it succeeds, and says where the rest of the model is.
    assert run.state == "succeeded", run.error
    assert run.artifact_uri == f"{copied} (and {host}:{job}/artifacts)"
    assert (job / "artifacts").is_dir() and not (job / "bundle").exists()  # kept for inspection, minus the bundle
    shutil.rmtree(job)  # the host's part: gone before the next test checks the host is clean


def test_the_hosts_listing_keeps_every_name_one_record(sshd_service):
    """list_files.py on the real host, read back by parse_listing: a name with any byte stays one record."""
    import subprocess

    from potato.backends.ssh.fetch import LIST_FILES_SOURCE, parse_listing

    root = Path(sshd_service.shared_dir) / f"listing-{os.getpid()}"
    root.mkdir()
    try:
        (root / "a\nb\tc").write_bytes(b"12345")
        (root / "sub").mkdir()
        (root / "sub" / "model.bin").write_bytes(b"x" * 10)
        (root / "bad\xff".encode("latin-1").decode("utf-8", "surrogateescape")).write_bytes(b"")
        (root / "link").symlink_to(root / "sub")
        for path in (root, *root.rglob("*")):  # the host's user owns what it lists, whatever root's umask was
            os.chown(path, *_ids(sshd_service.user), follow_symlinks=False)
        done = subprocess.run(sshd_service.ssh_argv("python3", "-", str(root)),
                              input=LIST_FILES_SOURCE.read_bytes(), capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        files, refused = parse_listing(done.stdout)
    finally:
        shutil.rmtree(root)
    assert files == [(10, "sub/model.bin")]
    assert sorted(refused) == [("a\nb\tc", "it holds a control character"),
                               ("bad\\xff", "its name is not valid UTF-8"),
                               ("link", "it is a symbolic link")]
