"""The OpenSSH client, as the ssh and slurm backends use it.

Why OpenSSH and not paramiko/fabric: only the OpenSSH client forwards a UNIX
socket (paramiko #544), honours ``~/.ssh/config`` (aliases, ProxyJump),
ssh-agent and ``known_hosts`` exactly as the user's own ``ssh`` does, and it
moves bulk data about twice as fast.

One ControlMaster connection per run carries the reverse forward from a fresh
UNIX socket in the remote ``/tmp`` to the run's protocol socket here; every
remote command then runs through the master in ~15 ms.

Every ``ssh`` starts in a session of its own. A Prefect process worker stops
a flow by sending SIGTERM to the flow's whole process group: the ssh client
carrying the remote agent must not die of that before the flow has stopped
the run its own way (the cancel, ``grace_seconds``, then the connection
closes). A flow killed outright leaves these clients behind, so
``potato.backends.ssh.leftovers`` finds them by the run's socket in their argv.

Pure builders (``make_*``) on top; ``Connection`` below is the only code that
starts ``ssh``.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO, Mapping, Sequence

from potato.config import BackendConfig
from potato.errors import RemoteCommandError, SshError

log = logging.getLogger(__name__)

# Every option Potato sets, and why.
SSH_OPTIONS = {
    # Fail at once instead of prompting for a password or passphrase.
    "BatchMode": "yes",
    # A reverse forward that cannot be set up must fail the connection, not
    # leave the agent without a way back to the server.
    "ExitOnForwardFailure": "yes",
    # Notice a dead network within about a minute rather than at TCP timeout.
    "ServerAliveInterval": "15",
    "ServerAliveCountMax": "4",
    "ConnectTimeout": "20",
}

# What ssh's last stderr line says, and what the user should do about it.
SSH_FAILURES = (
    ("Permission denied", "Permission denied",
     "Potato needs a key that logs in without a prompt: `ssh {host} true` must succeed from the account "
     "that runs the annotation server (a passphrase key works while ssh-agent holds it)"),
    ("Host key verification failed", "Host key verification failed",
     "the host's key is not in known_hosts: run `ssh {host} true` once from the annotation server's account "
     "and check the fingerprint"),
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", "the host's key has changed",
     "if the host was reinstalled, remove its old key with `ssh-keygen -R {host}`; otherwise ask its admin"),
    ("Connection refused", "Connection refused",
     "no ssh server listens there{on_port}: check the backend's host and port"),
    ("Could not resolve hostname", "host not found",
     "check the backend's host (any name `ssh` accepts works, ~/.ssh/config aliases too)"),
    ("Name or service not known", "host not found",
     "check the backend's host (any name `ssh` accepts works, ~/.ssh/config aliases too)"),
    ("Connection timed out", "Connection timed out{on_port}",
     "the host did not answer: check the network, a VPN, the port, and that its sshd answers "
     "(`ssh -v {host} true` shows where it stops)"),
    ("No route to host", "No route to host", "check the network or VPN"),
    ("remote port forwarding failed", "the reverse forward could not be set up",
     "the host's sshd must allow UNIX-socket forwarding (AllowStreamLocalForwarding / AllowTcpForwarding)"),
    ("Connection closed", "the connection was closed", "check the host's sshd logs"),
)


_PORT = re.compile(r"\bport (\d+)\b")

# Failures worth a second try: the network, not the setup (a wrong key stays wrong).
TRANSIENT_REASONS = ("Connection timed out", "No route to host", "the connection was closed", "no connection within")


def is_transient(exc: BaseException) -> bool:
    """True for an ssh failure that may pass on its own (a flaky network), so connecting again may help."""
    return isinstance(exc, SshError) and any(reason in str(exc) for reason in TRANSIENT_REASONS)


@dataclass(frozen=True)
class SshTarget:
    """Where and how to log in: the backend's host, user, port, identity_file and env."""

    host: str
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_backend(cls, backend: BackendConfig) -> "SshTarget":
        port = backend.get("port")
        identity = backend.get("identity_file")
        return cls(
            host=backend.host,
            user=backend.get("user"),
            port=int(port) if port else None,
            identity_file=os.path.expanduser(identity) if identity else None,
            env=dict(backend.get("env") or {}),
        )


def make_ssh_argv(
    target: SshTarget,
    remote_command: str | None = None,
    *,
    control_path: str | None = None,
    options: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The argv of one ``ssh`` invocation; *remote_command* is one string for the remote shell."""
    argv = ["ssh"]
    for key, value in {**SSH_OPTIONS, **(options or {})}.items():
        argv += ["-o", f"{key}={value}"]
    if target.user:
        argv += ["-l", target.user]
    if target.port:
        argv += ["-p", str(target.port)]
    if target.identity_file:
        argv += ["-i", target.identity_file]
    if control_path:
        argv += ["-S", control_path]
    argv += list(extra)
    # "--" ends ssh's options: nothing after it is read as one, whatever the host is called.
    argv += ["--", target.host]
    if remote_command is not None:
        argv.append(remote_command)
    return argv


def make_remote_command(words: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """One shell command line for the remote login shell, every word quoted once.

    ssh joins its arguments with spaces and the remote shell splits them
    again, so the command is built here as a single, fully quoted string.
    """
    command = shlex.join(words)
    if env:
        command = "env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " " + command
    command = "exec " + command
    if cwd:
        command = f"cd {remote_path(cwd)} && {command}"
    return command


def with_env(command: str, env: Mapping[str, str] | None) -> str:
    """*command* for the remote shell, after exporting *env* (the backend's ``env``)."""
    if not env:
        return command
    return "export " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + "; " + command


def remote_path(path: str) -> str:
    """Quote a remote path for the shell, keeping a leading ``~/`` as the login's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def describe_ssh_failure(host: str, stderr: str) -> tuple[str, str]:
    """(reason, fix) for ssh's own failure (exit 255), from its stderr."""
    lines = [line.strip() for line in stderr.replace("\r", "").splitlines() if line.strip()]
    # ssh names the port it tried ("connect to host h port 22: …", "Connection to h port 2222 timed out"),
    # ~/.ssh/config's included: said where a port is the likely culprit.
    port = next((m.group(1) for m in map(_PORT.search, lines) if m), None)
    on_port = f" on port {port}" if port else ""
    for needle, reason, fix in SSH_FAILURES:
        if any(needle in line for line in lines):
            return reason.format(on_port=on_port), fix.format(host=host, on_port=on_port)
    last = lines[-1] if lines else "ssh exited with status 255 and said nothing"
    return last, f"check that `ssh {host} true` works from the annotation server's account"


def ssh_error(host: str, stderr: str) -> SshError:
    reason, fix = describe_ssh_failure(host, stderr)
    return SshError(f"ssh to {host} failed: {reason}. Fix: {fix}")


class Connection:
    """One ControlMaster connection to a host, optionally carrying a reverse UNIX-socket forward."""

    def __init__(self, target: SshTarget, *, forward: tuple[str, str] | None = None):
        self.target = target
        self.forward = forward  # (remote socket path, local socket path or host:port)
        self.control_dir = tempfile.mkdtemp(prefix="potato-ssh-")
        # Short on purpose: a UNIX socket path must stay under ~104 bytes.
        self.control_path = os.path.join(self.control_dir, "cm")
        self.master: subprocess.Popen | None = None
        self._master_log = os.path.join(self.control_dir, "master.log")

    # ------------------------------------------------------------ lifecycle
    def open(self, timeout: float = 30.0) -> None:
        extra = ["-M", "-N"]
        if self.forward:
            extra += ["-R", f"{self.forward[0]}:{self.forward[1]}"]
        argv = make_ssh_argv(self.target, None, control_path=self.control_path,
                             options={"ControlPersist": "no"}, extra=extra)
        log.debug("ssh master: %s", shlex.join(argv))
        with open(self._master_log, "wb") as err:
            self.master = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                           start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.master.poll() is not None:
                raise ssh_error(self.target.host, self._read_master_log())
            if os.path.exists(self.control_path) and self._check():
                return
            time.sleep(0.05)
        self.close()
        port = self.target.port or 22
        raise SshError(f"ssh to {self.target.host} failed: no connection within {timeout:g} s on port {port}. Fix: "
                       f"check that {self.target.host} answers ssh on port {port} (`ssh -p {port} {self.target.host} "
                       "true` from the annotation server's account)")

    def _check(self) -> bool:
        argv = make_ssh_argv(self.target, None, control_path=self.control_path, extra=["-O", "check"])
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                              start_new_session=True).returncode == 0

    def alive(self) -> bool:
        return self.master is not None and self.master.poll() is None

    def lost(self) -> str | None:
        """Why the master exited while still wanted (ssh's own words), or None while it runs."""
        if self.master is None or self.master.poll() is None:
            return None
        return describe_ssh_failure(self.target.host, self._read_master_log())[0]

    def close(self) -> None:
        if self.master is not None and self.master.poll() is None:
            argv = make_ssh_argv(self.target, None, control_path=self.control_path, extra=["-O", "exit"])
            subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10, start_new_session=True)
            try:
                self.master.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.master.kill()
                self.master.wait(timeout=5)
        shutil.rmtree(self.control_dir, ignore_errors=True)

    def _read_master_log(self) -> str:
        try:
            with open(self._master_log, encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except OSError:
            return ""

    # ------------------------------------------------------------ commands
    def argv(self, command: str) -> list[str]:
        return make_ssh_argv(self.target, command, control_path=self.control_path)

    def run(self, command: str, *, input: bytes | None = None, timeout: float = 120, check: bool = True
            ) -> subprocess.CompletedProcess:
        """Run *command* (one remote shell line) through the master; map failures to errors."""
        return _run(self.target, self.argv(command), command, input=input, timeout=timeout, check=check)

    def popen(self, command: str, *, stdin: int | IO | None = subprocess.PIPE, stdout: int | IO | None = None,
              stderr: int | IO | None = None) -> subprocess.Popen:
        argv = self.argv(command)
        log.debug("ssh (streaming): %s", shlex.join(argv))
        return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True)


def run_once(target: SshTarget, command: str, *, input: bytes | None = None, timeout: float = 120,
             check: bool = True) -> subprocess.CompletedProcess:
    """Run *command* over a connection of its own, without a master.

    For work that must not leave anything behind if this process is killed
    mid-way: a ControlMaster lives in its own session and would outlive it;
    this ssh ends with its command.
    """
    return _run(target, make_ssh_argv(target, command), command, input=input, timeout=timeout, check=check)


def _run(target: SshTarget, argv: list[str], command: str, *, input: bytes | None, timeout: float, check: bool
         ) -> subprocess.CompletedProcess:
    log.debug("ssh: %s", shlex.join(argv))
    try:
        done = subprocess.run(argv, input=input, capture_output=True, timeout=timeout,
                              stdin=None if input is not None else subprocess.DEVNULL, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        raise RemoteCommandError(
            f"A command on {target.host} did not finish within {timeout:g} s: {command[:200]}") from exc
    if check and done.returncode == 255:
        raise ssh_error(target.host, done.stderr.decode(errors="replace"))
    if check and done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()
        raise RemoteCommandError(
            f"A command on {target.host} failed with exit status {done.returncode}"
            + (f": {tail[-1]}" if tail else ""))
    return done
