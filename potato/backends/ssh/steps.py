"""The ssh backend: zero-install training on a GPU host Potato logs in to.

Steps of a run, as the flow calls them:

1. ``connect``: one OpenSSH ControlMaster connection carrying a reverse forward
   from a fresh socket in the remote ``/tmp`` to this run's protocol socket.
2. ``pick_gpu``: one probe round trip (interpreter, code present?, packages,
   ``nvidia-smi``, torch's kernels), then the GPU by free memory.
3. ``sync_code``: the remote half as a tar stream into ``remote_dir/code/<hash>``
   (renamed into place, so a half copy is never used); the ``packages`` venv.
4. ``spawn``: ``python -m potato.training.agent`` in ``remote_dir/jobs/<run>``,
   the run token on standard input.
5. ``poll``/``stop``: the agent posts events over the socket; cancel reaches it
   as the answer to its next post; after ``grace_seconds`` the connection closes.
6. ``fetch_artifacts``: a tar stream back, bytes counted, with a stall timer.
7. ``clean_up``: ``stop_job.py`` on the host stops whatever of the run still runs
   there and checks it is gone (``leftovers``), then removes the job directory
   and socket; the master closes.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from potato import training
from potato.backends.base import RunContext
from potato.backends.ssh import fetch, leftovers, trainer_needs
from potato.backends.ssh.code import code_archive
from potato.backends.ssh.gpus import GpuChoice, choose_for_backend, mark_kernels, parse_nvidia_smi
from potato.backends.ssh.openssh import Connection, SshTarget, make_remote_command, remote_path, ssh_error, with_env
from potato.backends.ssh.protocol_server import ProtocolServer
from potato.errors import (
    BackendError,
    ConnectionLost,
    GpuQueryHung,
    RemoteCommandError,
    RemoteDirNotWritable,
    TrainerImportError,
)
from potato.runs import artifact_uri
from potato.runs.jobs import trainer_options
from potato.runs.runlog import last_line
from potato.training.device import THREAD_VARIABLES
from potato.training.job_paths import JobPaths
from potato.training.trainers.registry import TRAINERS, module_names

PROBE_SOURCE = Path(training.__file__).with_name("probe.py")
MIN_PYTHON = (3, 8)
# How long the agent may take to exit on its own after a cancel's grace period, before the
# connection is closed under it (it then kills its worker itself, on stdin's end).
STOP_MARGIN_S = 2.0


@dataclass
class SshSession:
    target: SshTarget
    connection: Connection
    python: str
    protocol: ProtocolServer | None = None
    remote_socket: str = ""
    remote_dir: str = ""
    code_hash: str = ""
    probe: dict = field(default_factory=dict)
    gpu: GpuChoice | None = None
    needs: trainer_needs.HostNeeds = field(default_factory=trainer_needs.HostNeeds)
    job_dir: str = ""
    left_on_host: bool = False

    @property
    def host(self) -> str:
        return self.target.host

    def code_dir(self) -> str:
        return f"{self.remote_dir}/code/{self.code_hash}"


@dataclass
class RemoteAgent:
    process: subprocess.Popen
    log_file: Any


# ------------------------------------------------------------------ pure builders


def make_probe_command(python: str, remote_dir: str, code_hash: str, packages: list[str],
                       env: dict | None = None, *, gpus: bool = True, questions: dict | None = None) -> str:
    words = shlex.join(["-", remote_dir, code_hash, json.dumps(packages), "gpus" if gpus else "no-gpus",
                        json.dumps(questions or {})])
    return with_env(f"exec {remote_path(python)} {words}", env)


def make_agent_env(session: SshSession, ctx: RunContext) -> dict[str, str]:
    env = dict(session.target.env)
    env["PYTHONPATH"] = session.code_dir()
    if session.gpu is not None:  # an ssh run chose them; a SLURM job gets its own from the scheduler
        # nvidia-smi numbers GPUs by PCI bus; make CUDA number them the same way.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = session.gpu.cuda_visible_devices
    threads = ctx.backend.get("num_threads")
    if threads:
        for name in THREAD_VARIABLES:  # overrides a login shell's OMP_NUM_THREADS=1
            env[name] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def make_agent_command(session: SshSession, ctx: RunContext, extra: list[str] = ()) -> str:
    words = [session.python, "-m", "potato.training.agent", "--socket", session.remote_socket,
             "--backend", ctx.backend.name, *extra]
    return make_remote_command(words, env=make_agent_env(session, ctx), cwd=session.job_dir)


def make_venv_command(python: str, env_dir: str, packages: list[str]) -> str:
    """Create the ``packages`` venv once: built beside its place, renamed in when complete.

    A killed install leaves only a ``.tmp-`` directory, never a half env at
    ``env_dir``; two runs building at once both succeed, one rename wins.
    """
    tmp = f"{env_dir}.tmp-{secrets.token_hex(4)}"
    q_env, q_tmp = shlex.quote(env_dir), shlex.quote(tmp)
    pip = shlex.join(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", *packages])
    rename = shlex.quote("import os,sys\ntry: os.rename(sys.argv[1], sys.argv[2])\nexcept OSError: pass")
    return (
        f"if [ ! -x {q_env}/bin/python ]; then "
        f"mkdir -p {shlex.quote(os.path.dirname(env_dir))} && "
        f"{shlex.quote(python)} -m venv --system-site-packages {q_tmp} && "
        f"{q_tmp}/bin/python {pip} && "
        f"{q_tmp}/bin/python -c {rename} {q_tmp} {q_env}; "
        f"status=$?; rm -rf {q_tmp}; [ -x {q_env}/bin/python ] || exit $status; fi"
    )


def _absolute(path: str, home: str) -> str:
    if path == "~":
        return home
    if path.startswith("~/"):
        return home.rstrip("/") + "/" + path[2:]
    return path


# ------------------------------------------------------------------ steps


def connect(ctx: RunContext) -> SshSession:
    target = SshTarget.from_backend(ctx.backend)
    ctx.set_step(f"connecting to {target.host}{ctx.attempt}")
    protocol = ProtocolServer(ctx.config, ctx.store)
    # A fresh path per run: the socket file stays behind if a session dies, and
    # a real host's sshd will not unlink it for the next bind (measured).
    remote_socket = f"/tmp/potato-{ctx.run_id}-{secrets.token_hex(6)}.sock"
    connection = Connection(target, forward=(remote_socket, protocol.socket_path))
    # Recorded first: the master outlives a flow killed with -9, and this is how it is found (leftovers.py).
    ctx.store.update_run(ctx.run_id, remote_socket=remote_socket)
    try:
        connection.open()
    except BaseException:
        protocol.stop()
        ctx.store.update_run(ctx.run_id, remote_socket=None)  # no connection, so no socket on the host
        raise
    ctx.log.info(f"Connected to {target.host} (reverse forward {remote_socket}); the run's protocol socket "
                 f"here is {protocol.socket_path}")
    return SshSession(target=target, connection=connection, protocol=protocol, remote_socket=remote_socket,
                      python=ctx.backend.get("python", "python3"))


def probe(session: SshSession, remote_dir: str, trainers: Sequence[str], *, gpus: bool = True,
          questions: dict | None = None) -> dict:
    """What the host has (training/probe.py), in one round trip; maps a missing interpreter to its error.

    *trainers*: the run's trainers (their packages are all looked for).
    *gpus*: whether to ask ``nvidia-smi`` (not on a SLURM login node, nor for ``gpus: none``).
    *questions*: what the trainers ask of the host (``trainer_needs.probe_questions``).
    """
    code_hash, _ = code_archive()
    packages = list(dict.fromkeys(p for name in trainers for p in TRAINERS[name].required_modules))
    command = make_probe_command(session.python, remote_dir, code_hash, packages, session.target.env, gpus=gpus,
                                 questions=questions)
    done = session.connection.run(command, input=PROBE_SOURCE.read_bytes(), timeout=120, check=False)
    stderr = done.stderr.decode(errors="replace")
    if done.returncode == 255:
        raise ssh_error(session.host, stderr)
    if done.returncode in (126, 127):
        raise BackendError(
            f"{session.python} was not found on {session.host}. Fix: set the backend's python to an "
            f"interpreter that exists there (`ssh {session.host} which python3` shows one)")
    try:
        report = json.loads(done.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = stderr.strip().splitlines()[-1:] or ["no output"]
        raise RemoteCommandError(f"{session.python} on {session.host} could not run Potato's probe: {tail[0]}")
    version = tuple(report.get("version_info") or (0, 0, 0))
    if version[:2] < MIN_PYTHON:
        raise BackendError(
            f"{session.python} on {session.host} is Python {report.get('python')}; Potato's agent needs "
            f"Python 3.8 or newer: point the backend's python at a newer interpreter")
    return report


def host_gpus(report: dict, host: str) -> list:
    """The host's GPUs from the probe's report; raises ``GpuQueryHung`` when nvidia-smi did not answer."""
    smi = report.get("nvidia_smi") or {}
    if smi.get("timed_out"):
        raise GpuQueryHung(host, smi["timed_out"])
    if not smi.get("found") or smi.get("status") != 0:
        return []  # no nvidia-smi, or "No devices were found": a host without GPUs
    return mark_kernels(parse_nvidia_smi(smi.get("stdout", "")), report.get("torch"))


def wants_gpus(backend) -> bool:
    """Whether a run on *backend* asks the host's nvidia-smi: a host whose GPUs Potato picks, unless ``gpus: none``."""
    return backend.type_info.picks_gpus and str(backend.get("gpus", "auto")).strip().lower() != "none"


def probe_host(ctx: RunContext, session: SshSession) -> dict:
    """Probe the host once for the run; remember what the next steps need.

    On a host that trains (not a SLURM login node) the run's trainers ask their questions too
    (``trainer_needs``): a problem they find there stops the run before anything is copied.
    """
    remote_dir = ctx.backend.get("remote_dir")
    trains_here = ctx.backend.type_info.picks_gpus
    options = {name: trainer_options(ctx.config, ctx.run, name) for name in ctx.run.trainers} if trains_here else {}
    # A packages venv is built after the probe: bitsandbytes is judged in it, by the worker.
    questions = trainer_needs.probe_questions(options, four_bit=not ctx.backend.get("packages"))
    report = probe(session, remote_dir, list(ctx.run.trainers), gpus=wants_gpus(ctx.backend), questions=questions)
    if not report.get("remote_dir_writable", True):
        raise RemoteDirNotWritable(session.host, report.get("user") or "the login account", remote_dir)
    session.probe = report
    session.remote_dir = _absolute(ctx.backend.get("remote_dir"), report["home"])
    session.code_hash = code_archive()[0]
    ctx.log.info(f"{session.host}: Python {report['python']} ({report['executable']})")
    session.needs = trainer_needs.assess(options, report, session.host)
    for note in session.needs.notes:  # each names the host
        ctx.log.info(note)
    for problem in session.needs.problems[1:]:
        ctx.log.error(problem)
    if session.needs.problems:
        raise BackendError(session.needs.problems[0])
    return report


def pick_gpu(ctx: RunContext, session: SshSession) -> str:
    ctx.set_step(f"checking {session.host}: Python and GPUs")
    report = probe_host(ctx, session)
    gpus = host_gpus(report, session.host)
    for gpu in gpus:
        ctx.log.info(f"{session.host}: {gpu.describe()}")
    needed = session.needs.gpu_mb if gpus else None
    choice = choose_for_backend(gpus, ctx.backend, needed_mb=needed, needed_by=session.needs.by)
    if needed is not None and choice.needed_mb == needed:
        ctx.log.info(f"gpus: auto takes a GPU with {needed} MB free ({session.needs.by}), more than "
                     f"min_free_gpu_mb ({choice.min_free_mb})")
    session.gpu = choice
    used = choice.describe(gpus)
    ctx.log.info(f"The run uses {used} on {session.host}")
    ctx.store.update_run(ctx.run_id, host_python=report["python"], gpu=used)
    return used


def sync_code(ctx: RunContext, session: SshSession) -> str:
    said = copy_code(ctx, session)
    packages = list(ctx.backend.get("packages") or ())
    missing = list(session.probe.get("missing") or ())
    if packages:
        env_dir = f"{session.remote_dir}/envs/{_packages_hash(packages)}"
        ctx.set_step(f"installing {', '.join(packages)} on {session.host}")
        session.connection.run(make_venv_command(session.python, env_dir, packages), timeout=3600)
        session.python = f"{env_dir}/bin/python"
        missing = _still_missing(session, missing)
        ctx.log.info(f"Using the venv {env_dir} (--system-site-packages)")
    if missing:
        needs = next((t for t in ctx.run.trainers if missing[0] in TRAINERS[t].required_modules), ctx.run.trainer)
        raise TrainerImportError(needs, missing[0], fix=(
            f"{session.python} on {session.host} lacks {module_names(missing)}: point the backend's python at an "
            f"interpreter that has them, or list them under packages"))
    return said


def copy_code(ctx: RunContext, session: SshSession) -> str:
    """Copy the remote half to ``remote_dir/code/<hash>`` unless the host has this version."""
    code_hash, archive = code_archive()
    if session.probe.get("code_present"):
        sent = 0
        said = f"{session.host} already has this version of Potato's code ({code_hash}); nothing copied"
    else:
        ctx.set_step(f"copying Potato's code to {session.host}")
        session.connection.run(_install_code_command(session.remote_dir, code_hash), input=archive, timeout=300)
        sent = len(archive)
        said = f"Copied Potato's code ({sent} bytes) to {session.code_dir()}"
    ctx.log.info(said)
    ctx.store.add_event(ctx.run_id, "code", {"hash": code_hash, "bytes_sent": sent})
    return said


def _install_code_command(remote_dir: str, code_hash: str) -> str:
    final = shlex.quote(f"{remote_dir}/code/{code_hash}")
    tmp = shlex.quote(f"{remote_dir}/code/.tmp-{code_hash}-{secrets.token_hex(4)}")
    # Unpacked beside its place and renamed in: a copy cut short is never used, and its
    # directory goes too (the connection dropped, or the flow was killed mid-copy).
    return (f"t={tmp}; trap 'rm -rf \"$t\"' EXIT; trap 'exit 1' HUP INT TERM PIPE; "
            f"mkdir -p \"$t\" && tar xzf - -C \"$t\" && {{ mv \"$t\" {final} 2>/dev/null || :; }} && "
            f"test -f {final}/potato/__init__.py")


def _packages_hash(packages: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(sorted(packages)).encode()).hexdigest()[:12]


def _still_missing(session: SshSession, names: list[str]) -> list[str]:
    if not names:
        return []
    check = "import importlib.util,sys; print(' '.join(n for n in sys.argv[1:] if importlib.util.find_spec(n) is None))"
    done = session.connection.run(shlex.join([session.python, "-c", check, *names]), timeout=120)
    return done.stdout.decode().split()


def spawn(ctx: RunContext, session: SshSession) -> RemoteAgent:
    make_job_dir(session, ctx)
    return start_agent(ctx, session)


def make_job_dir(session: SshSession, ctx: RunContext) -> str:
    session.job_dir = f"{session.remote_dir}/jobs/{ctx.run_id}-{secrets.token_hex(4)}"
    ctx.store.update_run(ctx.run_id, remote_job_dir=session.job_dir)  # before anything runs in it
    # 0700: the bundle holds the annotators' labels, and a GPU server is shared.
    session.connection.run(f"umask 077 && mkdir -p {shlex.quote(session.job_dir)}", timeout=60)
    return session.job_dir


def start_agent(ctx: RunContext, session: SshSession, extra: list[str] = ()) -> RemoteAgent:
    """``python -m potato.training.agent`` in the job directory, the run's token on its stdin."""
    from potato.runs.tokens import issue_run_token

    token = issue_run_token(ctx.store, ctx.run_id)
    command = make_agent_command(session, ctx, list(extra))
    log_file = open(ctx.paths.agent_log, "ab")
    process = session.connection.popen(command, stdin=subprocess.PIPE, stdout=log_file, stderr=log_file)
    # The token travels on standard input; stdin then stays open: its end tells the
    # agent that the connection is gone.
    process.stdin.write(token.encode() + b"\n")
    process.stdin.flush()
    ctx.store.heartbeat(ctx.run_id)
    ctx.set_step(f"waiting for the agent on {session.host}")
    ctx.log.info(f"Started the agent in {session.job_dir} on {session.host}")
    return RemoteAgent(process=process, log_file=log_file)


def poll(ctx: RunContext, session: SshSession, agent: RemoteAgent) -> int | None:
    code = ctx.paths.read_exit_code()
    if code is not None:
        return code
    if agent.process.poll() is not None:
        code = ctx.paths.read_exit_code()  # the result may have landed just before it exited
        if code is not None:
            return code
        lost = session.connection.lost()
        if lost is not None:
            raise ConnectionLost(session.host, lost)
        raise BackendError(
            f"The agent on {session.host} exited with status {agent.process.returncode} before reporting a "
            f"result; its last output is in {ctx.paths.agent_log}: {last_line(ctx.paths.agent_log) or '(nothing)'}")
    return None


def stop(ctx: RunContext, session: SshSession, agent: RemoteAgent, grace: float) -> None:
    """The cancel reaches the agent as the answer to its next post; after *grace* the connection closes."""
    deadline = time.monotonic() + grace + STOP_MARGIN_S
    while time.monotonic() < deadline and agent.process.poll() is None:
        time.sleep(0.2)
    _end_agent(agent)
    session.connection.close()  # the remote session ends: the agent sees stdin close and kills its worker


def _end_agent(agent: RemoteAgent | None) -> None:
    if agent is None:
        return
    if agent.process.poll() is None:
        try:
            agent.process.stdin.close()
        except OSError:
            pass
        try:
            agent.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            agent.process.send_signal(signal.SIGTERM)
            try:
                agent.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                agent.process.kill()
                agent.process.wait()
    agent.log_file.close()


def fetch_artifacts(ctx: RunContext, session: SshSession, agent: RemoteAgent) -> None:
    remote_artifacts = JobPaths(session.job_dir).artifacts
    if not ctx.backend.get("fetch_artifacts", True):
        session.left_on_host = True
        ctx.store.update_run(ctx.run_id, artifact_uri=artifact_uri.on_host(session.host, remote_artifacts))
        ctx.log.info(f"fetch_artifacts is false: the model stays on {session.host} in {remote_artifacts}")
        return
    files, refused = fetch.list_remote_files(session, remote_artifacts)
    _refused(ctx, session, refused)
    if not files:
        ctx.log.info("The trainer saved no artifacts")
        return
    limit = int(ctx.backend.get("max_artifact_mb", 2048)) * 1024 * 1024
    take = [(size, name) for size, name in files if size <= limit]
    for size, name in files:
        if size > limit:
            session.left_on_host = True
            ctx.log.warning(f"{name} ({size / 1048576:.0f} MB) is larger than max_artifact_mb and stays on "
                            f"{session.host} in {remote_artifacts}")
    _refused(ctx, session, fetch.copy_artifacts(ctx, session, take))
    uri = str(ctx.artifacts_dir)
    if session.left_on_host:
        uri = artifact_uri.partly_on_host(uri, session.host, remote_artifacts)
    ctx.store.update_run(ctx.run_id, artifact_uri=uri)


def _refused(ctx: RunContext, session: SshSession, refused: list[tuple[str, str]]) -> None:
    """Name in the run log each remote entry that was not copied, and why; it stays on the host."""
    for name, why in refused:
        session.left_on_host = True
        ctx.log.warning(f"Not copied from {session.host}: {name!r} in the artifacts, because {why}; "
                        f"it stays on the host in {JobPaths(session.job_dir).artifacts}")


def clean_up(ctx: RunContext, session: SshSession | None, agent: RemoteAgent | None) -> None:
    """Stop and remove what the run left on the host (leftovers.stop_on_host, verified), then close up here."""
    _end_agent(agent)
    if session is None:
        return
    try:
        remove = "all"
        if ctx.backend.get("keep_remote", False):
            remove = "none"
            ctx.log.info(f"keep_remote is true: the job directory stays on {session.host} in {session.job_dir}")
        elif session.left_on_host:
            remove = "bundle"  # the model stays where the run log says it is
        # Through the run's own connection; after a cancel or silence stop() closed it, an ssh of its own.
        stopped = leftovers.stop_on_host(session.target, session.python,
                                         leftovers.make_stop_spec(ctx.refresh(), remove=remove), session.connection)
        if stopped.verified:
            ctx.store.update_run(ctx.run_id, remote_job_dir=None, remote_socket=None, slurm_job_id=None)
            if stopped.said:
                ctx.log.info(f"Cleaned up on {session.host}: {stopped.said}")
        else:
            ctx.log.warning(f"Could not clean up on {session.host}: {stopped.said}")
    finally:
        session.connection.close()
        if session.protocol is not None:
            session.protocol.stop()
        shutil.rmtree(ctx.bundle_dir, ignore_errors=True)
        ctx.paths.bundle_archive.unlink(missing_ok=True)
        shutil.rmtree(ctx.paths.artifacts_partial, ignore_errors=True)
