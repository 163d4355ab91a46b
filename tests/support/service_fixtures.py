"""Fixtures for the real sshd, the real SLURM and the fake nvidia-smi.

Session-scoped, real daemons (no stand-ins), started as root on loopback:

- ``sshd_service`` — OpenSSH ``/usr/sbin/sshd`` on 127.0.0.1:<free port>,
  logging in as the unprivileged user ``potatotest`` with a generated
  ed25519 key. See :class:`SshdService` for the attributes.
- ``slurm_service`` — munged + ``/usr/sbin/slurmctld`` + ``/usr/sbin/slurmd``,
  one node with two fake GPUs and three partitions (``debug`` default,
  ``requeue``, ``urgent``). See :class:`SlurmService`.
- ``fake_gpus`` — function-scoped: ``fake_gpus([{...}, ...])`` puts the fake
  ``tests/services/nvidia-smi`` on the ssh user's PATH for one test.
- ``ssh_user_config`` — function-scoped: makes plain ``ssh <alias>`` (no
  ``-F``) reach the sshd for the account running pytest; yields the alias.

Config templates and the fake nvidia-smi live in ``tests/services/``.

The settings follow what was measured on real sshd and SLURM on this machine type.

Isolation between pytest sessions running at the same time (several
engineers share one machine): everything a session creates is keyed by a
session tag — its own sshd port and config, its own munged socket, its own
slurmctld/slurmd ports, spool and state, an ``authorized_keys_<tag>`` file,
and ``~potatotest/.potato-test/<tag>/``. The per-session values reach ssh
sessions through ``SetEnv`` in that session's sshd_config (``SLURM_CONF``,
``PATH``, ``FAKE_NVIDIA_SMI_GPUS``), so two sessions never read each other's
files. ``/etc/slurm/slurm.conf`` (the place a login shell without SLURM_CONF
looks) is written by the first session that needs it and restored by it.

Every process we start — and every ssh session and SLURM job below them —
carries ``POTATO_TEST_SERVICES=<tag>`` in its environment; teardown (and the
next session, after a crash) kills whatever still carries a dead session's
tag, so no daemon, job or remote agent outlives its session.

Without root or the packages the fixtures skip with a how-to; under
``CI=true`` they fail instead (CI must never skip these silently).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import stat
import string
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.tcp_proxy import TcpProxy

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICES_SRC = REPO_ROOT / "tests" / "services"
FAKE_NVIDIA_SMI = SERVICES_SRC / "nvidia-smi"

# Per-session state of every running test session lives here (tmpfs, root only
# writes). /run rather than /tmp: munged refuses sockets/keys under a
# world-writable directory.
SERVICES_ROOT = Path("/run/potato-test-services")
TEST_USER = "potatotest"
SSH_HOST_ALIAS = "potato-test-host"
TAG_ENV = "POTATO_TEST_SERVICES"
ETC_SLURM = Path("/etc/slurm")
ETC_SLURM_MARKER = ETC_SLURM / ".potato-test-owner"
ETC_SLURM_BACKUP = ETC_SLURM / ".potato-test-backup"
ETC_SLURM_FILES = ("slurm.conf", "gres.conf")

SSHD = "/usr/sbin/sshd"
SLURMCTLD = "/usr/sbin/slurmctld"   # not the *-wlm names: started that way the
SLURMD = "/usr/sbin/slurmd"         # node came up with Gres=(null) (measured)
MUNGED = "/usr/sbin/munged"

START_DEADLINE_S = 30.0


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(reason: str):
    """Skip (on a developer machine) or fail (in CI) a test needing a service."""
    if _in_ci():
        pytest.fail(f"test service unavailable in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _require(what: str, binaries: list[str], packages: str) -> None:
    how = f"run `bash scripts/test.sh` as root (it apt-get installs {packages})"
    if os.geteuid() != 0:
        _unavailable(f"the real {what} test service needs root and {packages}: {how}")
    missing = [b for b in binaries if not os.path.exists(b)]
    if missing:
        _unavailable(f"the real {what} test service needs {', '.join(missing)}: {how}")


def _run(argv, *, timeout=30.0, check=True, env=None, input=None, user=None):
    """The one subprocess caller of this module: argv list, always a timeout."""
    proc = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
        env=env, input=input, user=user,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(map(str, argv))} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        )
    return proc


def _popen(argv, *, stderr_path: Path, **kwargs) -> subprocess.Popen:
    """Start a daemon with stdin/stdout closed and stderr to ``stderr_path``."""
    with open(stderr_path, "w") as err:
        return subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, **kwargs)


def _wait_for(predicate, *, what: str, deadline_s: float = START_DEADLINE_S,
              interval: float = 0.05, detail=lambda: ""):
    """Poll ``predicate`` until truthy; raise a named timeout otherwise."""
    end = time.monotonic() + deadline_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {deadline_s:.0f} s waiting for {what}\n{detail()}")
        time.sleep(interval)
        interval = min(interval * 1.5, 0.5)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(True)[-n:])
    except OSError:
        return f"({path} unreadable)"


# --------------------------------------------------------------------------
# Session bookkeeping, stale-session clean-up, the process sweep
# --------------------------------------------------------------------------

def _proc_start_time(pid: int) -> str | None:
    try:
        # Field 22 of /proc/PID/stat; the comm field (2) may hold spaces, so
        # split after its closing parenthesis.
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _session_alive(session_dir: Path) -> bool:
    try:
        pid_s, start = (session_dir / "owner").read_text().split()
    except (OSError, ValueError):
        return False
    return _proc_start_time(int(pid_s)) == start


def _pids_with_tag(tag: str) -> list[int]:
    """Processes of a session: the tag in their environment or its dir in argv.

    The argv test catches the daemons themselves: sshd and slurmctld reuse
    their environment block for setproctitle, so /proc/PID/environ no longer
    shows the tag; their argv names the session's config file.
    """
    needle = f"{TAG_ENV}={tag}\0".encode()
    dir_needle = f"{SERVICES_ROOT}/{tag}/".encode()
    pids = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in b"\0" + env or dir_needle in cmdline:
            pids.append(int(entry))
    return pids


def _kill_tagged(tag: str, grace_s: float = 3.0) -> None:
    """TERM, then KILL, every process that carries the session's tag."""
    pids = _pids_with_tag(tag)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while pids and time.monotonic() < end:
        time.sleep(0.05)
        pids = [p for p in pids if _proc_start_time(p) is not None and not _is_zombie(p)]
    for pid in _pids_with_tag(tag):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _user_home(user: str) -> Path:
    return Path(pwd.getpwnam(user).pw_dir)


def _remove_session_files(tag: str) -> None:
    with contextlib.suppress(KeyError):
        home = _user_home(TEST_USER)
        shutil.rmtree(home / ".potato-test" / tag, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (home / ".ssh" / f"authorized_keys_{tag}").unlink()
    shutil.rmtree(SERVICES_ROOT / tag, ignore_errors=True)


@contextlib.contextmanager
def _machine_lock():
    """Serialise start-up bookkeeping between concurrent pytest sessions."""
    SERVICES_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    with open(SERVICES_ROOT / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _reap_stale_sessions() -> None:
    """Undo what crashed sessions left: daemons, jobs, files, /etc/slurm."""
    for d in SERVICES_ROOT.iterdir():
        if not d.is_dir() or _session_alive(d):
            continue
        _kill_tagged(d.name, grace_s=1.0)
        _remove_user_ssh_blocks(d.name)
        _remove_session_files(d.name)
    # The user's side of sessions whose /run dir is gone (e.g. after a reboot:
    # /run is a tmpfs). A live session creates its /run dir first, under the lock.
    with contextlib.suppress(KeyError, FileNotFoundError):
        home = _user_home(TEST_USER)
        leftovers = [p.name for p in (home / ".potato-test").iterdir()]
        leftovers += [p.name.removeprefix("authorized_keys_")
                      for p in (home / ".ssh").glob("authorized_keys_*")]
        for tag in set(leftovers):
            if not (SERVICES_ROOT / tag).is_dir():
                _remove_session_files(tag)
    _restore_etc_slurm(only_if_stale=True)


@dataclass
class _Session:
    tag: str
    dir: Path
    user: str
    user_home: Path
    user_dir: Path        # ~potatotest/.potato-test/<tag>: the user's side
    bin_dir: Path         # first on PATH in ssh sessions (fake nvidia-smi)
    gpus_file: Path       # FAKE_NVIDIA_SMI_GPUS
    shared_dir: Path      # "shared storage" for SLURM job directories
    slurm_conf: Path      # SLURM_CONF for ssh sessions and daemons
    notes: list[str] = field(default_factory=list)


def _ensure_user(user: str) -> None:
    try:
        pwd.getpwnam(user)
    except KeyError:
        _run(["useradd", "-m", "-s", "/bin/bash", user])
    # useradd leaves the password "!" (locked): with UsePAM no sshd then
    # refuses the account ("account is locked"), keys or not. "*" = no
    # password, not locked.
    _run(["usermod", "-p", "*", user])


def _chown_user(path: Path, user: str) -> None:
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)


def _mkdir_user(path: Path, user: str, mode: int = 0o755) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    _chown_user(path, user)
    path.chmod(mode)
    return path


def _open_path_for_others(paths: list[Path], notes: list[str]) -> None:
    """Give "others" search (x) permission on every directory above ``paths``.

    The ssh user must run this repo's ``.venv/bin/python``, whose interpreter
    may live under root's home (pyenv: /root/.pyenv/..., and /root is 0700).
    Only the traverse bit is added — nothing becomes listable or writable.
    It is left in place (another pytest session may rely on it); the note
    says what changed.
    """
    seen = set()
    for p in paths:
        for d in [p, *p.parents]:
            if d in seen or not d.is_dir():
                continue
            seen.add(d)
            mode = d.stat().st_mode
            if not mode & stat.S_IXOTH:
                d.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
                notes.append(f"chmod o+x {d} (so {TEST_USER} can reach the interpreter/repo)")


def _venv_python() -> Path:
    venv = REPO_ROOT / ".venv" / "bin" / "python"
    return venv if venv.exists() else Path(sys.executable)


@pytest.fixture(scope="session")
def _test_services_session():
    """The per-session tag, directories and the unprivileged user."""
    _require("sshd", [SSHD], "openssh-server")
    with _machine_lock():
        _reap_stale_sessions()
        tag = f"s{os.getpid()}-{secrets.token_hex(3)}"
        sdir = SERVICES_ROOT / tag
        sdir.mkdir(mode=0o755)
        (sdir / "owner").write_text(f"{os.getpid()} {_proc_start_time(os.getpid())}\n")
    _ensure_user(TEST_USER)
    home = _user_home(TEST_USER)
    home.chmod(0o755)   # StrictModes: not group/other-writable; 0755 so the job dirs read as shared
    _mkdir_user(home / ".potato-test", TEST_USER)
    user_dir = _mkdir_user(home / ".potato-test" / tag, TEST_USER)
    notes: list[str] = []
    py = _venv_python()
    _open_path_for_others(
        [REPO_ROOT, py.parent, py.resolve().parent, Path(sys.base_prefix), Path(sys.prefix)], notes
    )
    _install_profile_hook(home)
    session = _Session(
        tag=tag, dir=sdir, user=TEST_USER, user_home=home, user_dir=user_dir,
        bin_dir=_mkdir_user(user_dir / "bin", TEST_USER),
        gpus_file=user_dir / "gpus.json",
        shared_dir=_mkdir_user(user_dir / "shared", TEST_USER),
        slurm_conf=sdir / "slurm" / "etc" / "slurm.conf",
        notes=notes,
    )
    try:
        yield session
    finally:
        _kill_tagged(tag)
        _remove_session_files(tag)


_PROFILE_HOOK = """
# potato tests: a session's bin dir (fake nvidia-smi) first on PATH, also in
# login shells (/etc/profile resets PATH). Set per sshd via SetEnv.
if [ -n "$POTATO_TEST_BIN" ] && [ -d "$POTATO_TEST_BIN" ]; then PATH="$POTATO_TEST_BIN:$PATH"; fi
"""


def _install_profile_hook(home: Path) -> None:
    profile = home / ".profile"
    text = profile.read_text() if profile.exists() else ""
    if "POTATO_TEST_BIN" not in text:
        profile.write_text(text + _PROFILE_HOOK)
        _chown_user(profile, TEST_USER)


# --------------------------------------------------------------------------
# sshd
# --------------------------------------------------------------------------

@dataclass
class SshdService:
    """A running OpenSSH sshd on loopback, and how to log in to it.

    Attributes: ``host`` ("127.0.0.1"), ``port``, ``user`` (unprivileged),
    ``user_home``, ``identity_file`` (ed25519, mode 0600), ``wrong_identity_file``
    (a key sshd does not accept), ``known_hosts`` (holds the host key),
    ``ssh_config`` (client config; ``ssh -F ssh_config potato-test-host``),
    ``host_alias``, ``ssh_options`` (the same settings as ``-o`` words, for
    callers that pass host/port/user/key themselves), ``python`` (this repo's
    interpreter, runnable by ``user``), ``bin_dir`` (first on PATH in ssh
    sessions), ``shared_dir`` (a writable dir of ``user``), ``log`` (sshd's log).
    """

    host: str
    port: int
    user: str
    user_home: Path
    identity_file: Path
    wrong_identity_file: Path
    known_hosts: Path
    ssh_config: Path
    host_alias: str
    python: Path
    bin_dir: Path
    shared_dir: Path
    log: Path
    tag: str

    @property
    def ssh_options(self) -> list[str]:
        """``-o`` words pinning the host key and the key, without ``-F``."""
        opts = {
            # Only our known_hosts: a host key mismatch must fail, never prompt.
            "UserKnownHostsFile": str(self.known_hosts),
            "GlobalKnownHostsFile": "/dev/null",
            "StrictHostKeyChecking": "yes",
            # Offer only the given key (an ssh-agent's keys would mask a wrong one).
            "IdentitiesOnly": "yes",
            # Fail instead of prompting for a password / passphrase.
            "BatchMode": "yes",
            "ConnectTimeout": "10",
        }
        words = []
        for k, v in opts.items():
            words += ["-o", f"{k}={v}"]
        return words

    def ssh_argv(self, *remote_words: str, options: tuple[str, ...] = ()) -> list[str]:
        """argv running ``remote_words`` (each quoted for the remote shell)."""
        argv = ["ssh", "-F", str(self.ssh_config), *options, self.host_alias]
        if remote_words:
            argv.append(shlex.join(remote_words))
        return argv

    def run(self, remote_command: str, *, input: str | None = None, timeout: float = 60,
            options: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        """Run a remote shell command line over ssh; returns the CompletedProcess."""
        argv = ["ssh", "-F", str(self.ssh_config), *options, self.host_alias, remote_command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              input=input, stdin=None if input is not None else subprocess.DEVNULL)


def _render(template: str, dest: Path, **values) -> None:
    """Fill a tests/services/*.in template (``${name}``) into ``dest``."""
    text = string.Template((SERVICES_SRC / template).read_text()).substitute(values)
    dest.write_text(text)


def _write_sshd_config(path: Path, *, port: int, session: _Session, pidfile: Path,
                       hostkey: Path) -> None:
    setenv = {
        TAG_ENV: session.tag,
        "SLURM_CONF": str(session.slurm_conf),
        "FAKE_NVIDIA_SMI_GPUS": str(session.gpus_file),
        "POTATO_TEST_BIN": str(session.bin_dir),
        "PATH": f"{session.bin_dir}:/usr/local/bin:/usr/bin:/bin",
    }
    _render("sshd_config.in", path, port=port, host_key=hostkey, pid_file=pidfile,
            tag=session.tag, user=session.user,
            setenv=" ".join(f"{k}={v}" for k, v in setenv.items()))


def _keygen(path: Path, comment: str) -> str:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])
    return Path(f"{path}.pub").read_text().strip()


@pytest.fixture(scope="session")
def sshd_service(_test_services_session) -> SshdService:
    """A real OpenSSH sshd on 127.0.0.1 for the session (see SshdService)."""
    session = _test_services_session
    _require("sshd", [SSHD, "/usr/bin/ssh", "/usr/bin/ssh-keygen"],
             "openssh-server openssh-client")
    t0 = time.monotonic()
    sdir = session.dir / "sshd"
    sdir.mkdir(mode=0o700)
    cdir = session.dir / "client"
    cdir.mkdir(mode=0o700)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)   # privilege separation dir

    hostkey = sdir / "ssh_host_ed25519_key"
    host_pub = _keygen(hostkey, f"potato-test-host-{session.tag}")
    identity = cdir / "id_ed25519"
    client_pub = _keygen(identity, f"potato-test-client-{session.tag}")
    wrong = cdir / "wrong_id_ed25519"
    _keygen(wrong, "not-authorized")

    ssh_dir = _mkdir_user(session.user_home / ".ssh", session.user, 0o700)
    ak = ssh_dir / f"authorized_keys_{session.tag}"
    ak.write_text(client_pub + "\n")
    _chown_user(ak, session.user)
    ak.chmod(0o600)

    log = sdir / "sshd.log"
    pidfile = sdir / "sshd.pid"
    cfg = sdir / "sshd_config"
    known_hosts = cdir / "known_hosts"
    ssh_config = cdir / "ssh_config"
    proc = service = None
    for _attempt in range(3):
        port = _free_port()
        _write_sshd_config(cfg, port=port, session=session, pidfile=pidfile, hostkey=hostkey)
        known_hosts.write_text(f"[127.0.0.1]:{port} {' '.join(host_pub.split()[:2])}\n")
        _render("ssh_config.in", ssh_config, alias=SSH_HOST_ALIAS, port=port,
                user=session.user, identity_file=identity, known_hosts=known_hosts)
        # -D: stay in the foreground so the Popen is the daemon and we stop
        # exactly what we started; -E: log to our file. Absolute path: sshd
        # refuses to re-exec itself otherwise.
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", TAG_ENV: session.tag}
        proc = _popen([SSHD, "-D", "-f", cfg, "-E", log], env=env,
                      stderr_path=sdir / "sshd.stderr", start_new_session=True)
        _wait_for(lambda: proc.poll() is not None or _port_open(port),
                  what=f"sshd to listen on 127.0.0.1:{port}", detail=lambda: _tail(log))
        service = SshdService(
            host="127.0.0.1", port=port, user=session.user, user_home=session.user_home,
            identity_file=identity, wrong_identity_file=wrong, known_hosts=known_hosts,
            ssh_config=ssh_config, host_alias=SSH_HOST_ALIAS, python=_venv_python(),
            bin_dir=session.bin_dir, shared_dir=session.shared_dir, log=log, tag=session.tag,
        )
        # Ready means a login works, not only that something listens there.
        probe = service.run("true", timeout=20) if proc.poll() is None else None
        if probe is not None and probe.returncode == 0:
            break
        # Our sshd lost the port (to a racing process or a leftover sshd):
        # stop it if it still runs and try another port.
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=5)
        proc = None
    if proc is None:
        raise RuntimeError(f"sshd did not start or refused the login:\n{_tail(log)}\n"
                           f"{_tail(sdir / 'sshd.stderr')}")
    for note in session.notes:
        print(f"[sshd_service] {note}", file=sys.stderr)
    print(f"[sshd_service] sshd on 127.0.0.1:{port} ready in {time.monotonic() - t0:.2f} s",
          file=sys.stderr)
    try:
        yield service
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


# --------------------------------------------------------------------------
# The sshd as a plain `ssh NAME` (no -F) for the account running the tests
# --------------------------------------------------------------------------

def _marked_files() -> tuple[Path, Path]:
    ssh_dir = Path(pwd.getpwuid(os.geteuid()).pw_dir) / ".ssh"   # ssh reads pw_dir, not $HOME
    return ssh_dir / "config", ssh_dir / "known_hosts"


def _strip_block(path: Path, tag: str) -> None:
    if not path.exists():
        return
    begin, end = f"# >>> potato-test {tag}\n", f"# <<< potato-test {tag}\n"
    text = path.read_text()
    while begin in text and end in text:
        a = text.index(begin)
        b = text.index(end, a) + len(end)
        text = text[:a] + text[b:]
    if text:
        path.write_text(text)
    else:
        path.unlink()   # only our block was there: the file was ours


def _remove_user_ssh_blocks(tag: str) -> None:
    for path in _marked_files():
        _strip_block(path, tag)
    _strip_block(_marked_files()[1], _forwarded_tag(tag))


def _forwarded_tag(tag: str) -> str:
    # Its own marker: ssh_user_config's teardown must not take a forwarded port's key with its own block.
    return f"{tag}-forwarded"


def trust_forwarded_port(sshd_service, port: int) -> None:
    """Trust the sshd's host key at ``[127.0.0.1]:<port>`` (a proxy in front of it) in this account's known_hosts.

    Marked with the session's tag, so ``untrust_forwarded_ports`` (or, after a crash, the next session) removes it.
    """
    _, known = _marked_files()
    key = " ".join(sshd_service.known_hosts.read_text().split()[1:3])
    tag = _forwarded_tag(sshd_service.tag)
    with _machine_lock():
        known.parent.mkdir(mode=0o700, exist_ok=True)
        with open(known, "a") as fh:
            fh.write(f"# >>> potato-test {tag}\n[127.0.0.1]:{port} {key}\n# <<< potato-test {tag}\n")


def untrust_forwarded_ports(sshd_service) -> None:
    with _machine_lock():
        _strip_block(_marked_files()[1], _forwarded_tag(sshd_service.tag))


@pytest.fixture
def ssh_user_config(sshd_service) -> str:
    """Make ``ssh <alias>`` work for this process's user without ``-F``; yields the alias.

    For tests of code that runs plain ``ssh HOST`` (``host`` may be a
    ``~/.ssh/config`` alias): adds a marked ``Host potato-test-host-<tag>``
    block to the user's ``~/.ssh/config`` and the host key to its
    ``~/.ssh/known_hosts``; both are removed after the test (or by the next
    session, after a crash). The alias is per session, so concurrent sessions
    never read each other's block.
    """
    alias = f"{SSH_HOST_ALIAS}-{sshd_service.tag}"
    config, known = _marked_files()
    with _machine_lock():
        config.parent.mkdir(mode=0o700, exist_ok=True)
        block = sshd_service.ssh_config.read_text().replace(
            f"Host {SSH_HOST_ALIAS}\n", f"Host {alias}\n")
        old = config.read_text() if config.exists() else ""
        # Prepended: ssh takes the first value it finds for each option.
        config.write_text(f"# >>> potato-test {sshd_service.tag}\n{block}"
                          f"# <<< potato-test {sshd_service.tag}\n{old}")
        config.chmod(0o600)
        with open(known, "a") as fh:
            fh.write(f"# >>> potato-test {sshd_service.tag}\n"
                     f"{sshd_service.known_hosts.read_text()}"
                     f"# <<< potato-test {sshd_service.tag}\n")
    try:
        yield alias
    finally:
        with _machine_lock():
            for path in (config, known):
                _strip_block(path, sshd_service.tag)


# --------------------------------------------------------------------------
# fake nvidia-smi
# --------------------------------------------------------------------------

@pytest.fixture
def fake_gpus(sshd_service):
    """Install the fake ``nvidia-smi`` for the ssh user, for one test.

    Call it with a list of GPUs (dicts with index, name, memory_total,
    memory_used, memory_free, utilization_gpu, pci_bus_id, compute_cap,
    optionally uuid); ``[]`` makes it answer "No devices were found" (exit 6).
    Returns the path of the GPU file. Outside such a test the ssh user has
    no ``nvidia-smi`` at all (a CPU-only host).

    It goes into the session's bin dir, which this session's sshd puts first
    on PATH (sshd_config ``SetEnv PATH=…``, plus a ~/.profile hook for login
    shells); the GPU file is found through ``SetEnv FAKE_NVIDIA_SMI_GPUS``.
    """
    target = sshd_service.bin_dir / "nvidia-smi"
    gpus_file = _session_gpus_file(sshd_service)

    def install(gpus: list[dict]) -> Path:
        tmp = gpus_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(gpus, indent=1))
        _chown_user(tmp, sshd_service.user)
        tmp.chmod(0o644)
        os.replace(tmp, gpus_file)
        shutil.copyfile(FAKE_NVIDIA_SMI, target)
        target.chmod(0o755)
        return gpus_file

    try:
        yield install
    finally:
        for p in (target, gpus_file):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def _session_gpus_file(sshd_service: SshdService) -> Path:
    return sshd_service.user_home / ".potato-test" / sshd_service.tag / "gpus.json"


# --------------------------------------------------------------------------
# SLURM
# --------------------------------------------------------------------------

@dataclass
class SlurmService:
    """A running single-node SLURM cluster (munge, slurmctld, slurmd).

    Attributes: ``partitions`` (``debug`` default, PreemptMode=CANCEL;
    ``requeue``, PreemptMode=REQUEUE; both PriorityTier 1 — ``urgent``,
    PriorityTier 10, preempts them), ``default_partition``, ``node``,
    ``gres`` (``["gpu:0", ...]``-style total: ``"gpu:2"``), ``gpu_count``,
    ``conf`` (slurm.conf path, also SLURM_CONF in ssh sessions), ``env``
    (environment for running SLURM commands locally), ``shared_dir`` (job
    directories: the ssh user's writable "shared storage", not under /tmp),
    ``logs`` (dict of daemon log paths), ``min_job_age`` (s a finished job
    stays visible to ``squeue -t all``/``scontrol``).
    """

    partitions: list[str]
    default_partition: str
    node: str
    gres: str
    gres_names: list[str]
    gpu_count: int
    conf: Path
    env: dict
    shared_dir: Path
    logs: dict
    min_job_age: int
    user: str

    def run(self, *argv: str, timeout: float = 30, user: str | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:
        """Run a SLURM command (``sbatch``, ``squeue``…) on this machine.

        As root by default; ``user=slurm_service.user`` runs it as the
        unprivileged user (cwd must then be readable by that user).
        """
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=self.env, input=input, user=user,
                              stdin=None if input is not None else subprocess.DEVNULL,
                              cwd=self.shared_dir if user else None)

    def wait_idle(self, deadline_s: float = 30) -> None:
        """Wait until no job is left in the queue (e.g. between tests)."""
        _wait_for(lambda: self.run("squeue", "-h", "-o", "%i").stdout.strip() == "",
                  what="the SLURM queue to drain", deadline_s=deadline_s)


def _node_hardware() -> str:
    """The node's hardware words from ``slurmd -C``, RealMemory a little under."""
    first = _run([SLURMD, "-C"]).stdout.splitlines()[0].split()
    kv = dict(w.split("=", 1) for w in first if "=" in w)
    kv.pop("NodeName", None)
    # Configured above what slurmd measures, the node drains ("Low RealMemory").
    kv["RealMemory"] = str(max(1, int(int(kv.get("RealMemory", "1024")) * 0.9)))
    return " ".join(f"{k}={v}" for k, v in kv.items())


def _write_slurm_conf(sdir: Path, *, node: str, munge_socket: Path, ctld_port: int,
                      slurmd_port: int, dev_dir: Path, min_job_age: int) -> None:
    etc = sdir / "etc"
    _render("slurm.conf.in", etc / "slurm.conf", node=node, ctld_port=ctld_port,
            slurmd_port=slurmd_port, munge_socket=munge_socket, dir=sdir,
            min_job_age=min_job_age, hardware=_node_hardware())
    _render("gres.conf.in", etc / "gres.conf", dev_dir=dev_dir)


def _restore_etc_slurm(*, only_if_stale: bool = False, tag: str | None = None) -> None:
    """Put back the /etc/slurm files a (possibly crashed) session replaced."""
    if not ETC_SLURM_MARKER.exists() and not ETC_SLURM_BACKUP.exists():
        return
    owner = ETC_SLURM_MARKER.read_text().strip() if ETC_SLURM_MARKER.exists() else ""
    if tag is not None and owner != tag:
        return
    if only_if_stale and owner and _session_alive(SERVICES_ROOT / owner):
        return
    for name in ETC_SLURM_FILES:
        saved = ETC_SLURM_BACKUP / name
        if saved.exists():
            os.replace(saved, ETC_SLURM / name)
        else:
            with contextlib.suppress(FileNotFoundError):
                (ETC_SLURM / name).unlink()
    shutil.rmtree(ETC_SLURM_BACKUP, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        ETC_SLURM_MARKER.unlink()


def _claim_etc_slurm(tag: str, etc: Path) -> bool:
    """Install our config as /etc/slurm/slurm.conf unless a live session has.

    Ssh sessions get SLURM_CONF from sshd anyway; /etc/slurm is for shells
    that lack it. Order (backup, then marker, then files) keeps every crash
    point recoverable by _restore_etc_slurm.
    """
    with _machine_lock():
        _restore_etc_slurm(only_if_stale=True)
        if ETC_SLURM_MARKER.exists():
            return False
        ETC_SLURM.mkdir(mode=0o755, exist_ok=True)
        tmp = ETC_SLURM / ".potato-test-backup.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name in ETC_SLURM_FILES:
            if (ETC_SLURM / name).exists():
                shutil.copy2(ETC_SLURM / name, tmp / name)
        os.replace(tmp, ETC_SLURM_BACKUP)
        ETC_SLURM_MARKER.write_text(tag + "\n")
        for name in ETC_SLURM_FILES:
            shutil.copyfile(etc / name, ETC_SLURM / name)
            (ETC_SLURM / name).chmod(0o644)
        return True


def _start_munged(mdir: Path, tag: str) -> tuple[subprocess.Popen, Path]:
    pw = pwd.getpwnam("munge")
    mdir.mkdir(mode=0o755)
    os.chown(mdir, pw.pw_uid, pw.pw_gid)
    key = mdir / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    os.chown(key, pw.pw_uid, pw.pw_gid)
    key.chmod(0o400)
    sock = mdir / "munge.socket"
    log = mdir / "munged.log"
    proc = _popen(
        [MUNGED, "--foreground", f"--key-file={key}", f"--socket={sock}",
         f"--pid-file={mdir / 'munged.pid'}", f"--log-file={log}",
         f"--seed-file={mdir / 'munged.seed'}", "--num-threads=4"],
        user="munge", group="munge", extra_groups=[],
        env={"PATH": "/usr/sbin:/usr/bin:/bin", TAG_ENV: tag},
        stderr_path=mdir.parent / "munged.stderr", start_new_session=True,
    )
    _wait_for(lambda: proc.poll() is not None or sock.exists(), what="munged's socket",
              detail=lambda: _tail(log))
    if proc.poll() is not None:
        raise RuntimeError(f"munged exited {proc.returncode}:\n{_tail(log)}"
                           f"{_tail(mdir.parent / 'munged.stderr')}")
    return proc, sock


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


@pytest.fixture(scope="session")
def slurm_service(_test_services_session) -> SlurmService:
    """A real single-node SLURM 22.05 cluster for the session (see SlurmService)."""
    session = _test_services_session
    _require("SLURM", [SLURMCTLD, SLURMD, MUNGED, "/usr/bin/sbatch"],
             "slurm-wlm munge")
    t0 = time.monotonic()
    sdir = session.dir / "slurm"
    for sub in ("etc", "state", "spool", "log", "dev"):
        (sdir / sub).mkdir(parents=True, mode=0o755)
    (sdir / "state").chmod(0o700)
    dev_dir = sdir / "dev"
    for i in range(2):
        # mknod -m 666 F c 1 3: the same device as /dev/null; slurmd only
        # needs character devices to hand out as gpu gres.
        os.mknod(dev_dir / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        (dev_dir / f"nvidia{i}").chmod(0o666)

    procs: list[subprocess.Popen] = []
    claimed = False
    try:
        munged, munge_sock = _start_munged(session.dir / "munge", session.tag)
        procs.append(munged)
        node = socket.gethostname().split(".")[0]
        min_job_age = 300
        _write_slurm_conf(sdir, node=node, munge_socket=munge_sock, ctld_port=_free_port(),
                          slurmd_port=_free_port(), dev_dir=dev_dir, min_job_age=min_job_age)
        conf = sdir / "etc" / "slurm.conf"
        assert conf == session.slurm_conf
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": str(conf),
               "LANG": "C.UTF-8"}
        daemon_env = {**env, TAG_ENV: session.tag}
        logs = {"slurmctld": sdir / "log" / "slurmctld.log",
                "slurmd": sdir / "log" / "slurmd.log",
                "munged": session.dir / "munge" / "munged.log"}
        ctld = _popen([SLURMCTLD, "-D", "-i", "-f", conf], env=daemon_env,
                      stderr_path=sdir / "log" / "slurmctld.stderr", start_new_session=True)
        procs.append(ctld)
        slurmd = _popen([SLURMD, "-D", "-f", conf, "-N", node], env=daemon_env,
                        stderr_path=sdir / "log" / "slurmd.stderr", start_new_session=True)
        procs.append(slurmd)

        def node_state():
            for p in (ctld, slurmd):
                if p.poll() is not None:
                    raise RuntimeError(
                        f"{p.args[0]} exited {p.returncode}:\n{_tail(logs['slurmctld'])}\n"
                        f"{_tail(logs['slurmd'])}")
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True,
                                 text=True, env=env, timeout=15)
            # One line per (node, partition): all must say idle.
            return set(out.stdout.split()) == {"idle"}

        _wait_for(node_state, what=f"SLURM node {node} to be idle",
                  detail=lambda: _tail(logs["slurmctld"]) + _tail(logs["slurmd"]))
        claimed = _claim_etc_slurm(session.tag, sdir / "etc")
        service = SlurmService(
            partitions=["debug", "requeue", "urgent"], default_partition="debug", node=node,
            gres="gpu:2", gres_names=["gpu"], gpu_count=2, conf=conf, env=env,
            shared_dir=session.shared_dir, logs=logs, min_job_age=min_job_age,
            user=session.user,
        )
        print(f"[slurm_service] node {node} idle in {time.monotonic() - t0:.2f} s"
              f" (/etc/slurm/slurm.conf {'installed' if claimed else 'left to another session'})",
              file=sys.stderr)
        yield service
    finally:
        with contextlib.suppress(Exception):
            env_ = {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(session.slurm_conf)}
            if all(p.poll() is None for p in procs) and len(procs) == 3:
                ids = _run(["squeue", "-h", "-o", "%i"], env=env_, timeout=15).stdout.split()
                if ids:
                    _run(["scancel", *ids], env=env_, timeout=15, check=False)
                    _wait_for(lambda: not _run(["squeue", "-h", "-o", "%i"], env=env_,
                                               timeout=15).stdout.strip(),
                              what="cancelled jobs to leave", deadline_s=15)
        _stop(list(reversed(procs)))
        if claimed:
            with _machine_lock():
                _restore_etc_slurm(tag=session.tag)


@pytest.fixture(scope="session")
def ssh_proxy(sshd_service):
    """A TCP proxy in front of the session's sshd, trusted in known_hosts: the fault projects' ssh and slurm
    backends log in through it (a case can cut, black-hole or slow it down)."""
    proxy = TcpProxy(sshd_service.port, lifetime_s=3600)
    trust_forwarded_port(sshd_service, proxy.port)
    yield proxy
    proxy.close()
    untrust_forwarded_ports(sshd_service)
