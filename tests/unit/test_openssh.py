"""Pure parts of the OpenSSH layer: argv, quoting, failure messages, what is worth a retry."""

from __future__ import annotations

import subprocess

import pytest

from potato.errors import SshError
from potato.backends.ssh.openssh import (
    SshTarget, describe_ssh_failure, is_transient, make_remote_command, make_ssh_argv, remote_path, ssh_error,
)


def test_ssh_argv_passes_user_port_identity_and_ends_options_before_the_host():
    argv = make_ssh_argv(SshTarget(host="gpu.example.org", user="me", port=2222, identity_file="/k"), "true",
                         control_path="/tmp/cm")
    assert argv[:1] == ["ssh"] and argv[-3:] == ["--", "gpu.example.org", "true"]
    assert ["-l", "me"] == argv[argv.index("-l"):argv.index("-l") + 2]
    assert ["-p", "2222"] == argv[argv.index("-p"):argv.index("-p") + 2]
    assert ["-i", "/k"] == argv[argv.index("-i"):argv.index("-i") + 2]
    assert "BatchMode=yes" in argv and "ExitOnForwardFailure=yes" in argv
    assert "StrictHostKeyChecking=no" not in " ".join(argv)


@pytest.mark.parametrize("word", ["a 0", "a'; echo foo", "new\nline", "$HOME", "*"])
def test_remote_commands_reach_the_remote_shell_as_one_word(word, tmp_path):
    # One shell layer, as the remote login shell will parse it.
    command = make_remote_command(["printf", "%s", word], env={"K": "v w"}, cwd=str(tmp_path))
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert done.stdout == word


def test_remote_path_keeps_the_home_directory():
    assert remote_path("~/.cache/potato training") == "\"$HOME\"/'.cache/potato training'"
    assert remote_path("/abs/x") == "/abs/x"


@pytest.mark.parametrize("stderr, reason", [
    ("potato@127.0.0.1: Permission denied (publickey).\r\n", "Permission denied"),
    ("No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.\r\n"
     "Host key verification failed.\r\n", "Host key verification failed"),
    ("ssh: connect to host 127.0.0.1 port 2223: Connection refused\r\n", "Connection refused"),
    ("ssh: Could not resolve hostname nowhere: Name or service not known\r\n", "host not found"),
])
def test_ssh_failures_are_named(stderr, reason):
    assert describe_ssh_failure("gpu.example.org", stderr)[0] == reason
    assert str(ssh_error("gpu.example.org", stderr)).startswith(f"ssh to gpu.example.org failed: {reason}. Fix: ")


def test_only_network_failures_are_retried():
    assert is_transient(ssh_error("h", "ssh: connect to host h port 22: Connection timed out\r\n"))
    assert not is_transient(ssh_error("h", "me@h: Permission denied (publickey).\r\n"))
    assert not is_transient(SshError("No GPU has 4000 MB free"))
    assert not is_transient(ValueError("Connection timed out"))
