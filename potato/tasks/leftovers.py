"""Stop what a run left running, and prove it: the door every end of a run goes through.

A run ends by its own flow, by the dispatcher that saw the flow's process
exit, or by reconciliation that found the flow gone or wedged (kill -9, the
OOM killer, a crashed server). In each case something the run started may
still be running, and the next run must not start beside it (SPEC §3):

- local: the worker's process group (``worker_pid``);
- ssh and slurm: on this machine the run's ssh ControlMaster and the ssh
  client carrying the agent (each in its own session or orphaned when the
  flow dies: they outlive it); on the host the agent, the worker's process
  group and a SLURM job (``remote_socket``, recorded before connecting;
  ``remote_job_dir``, before the job directory exists; ``slurm_job_id`` once
  the agent has submitted, and in the job directory);
- agent: a machine this server cannot reach. Its agent learns from its next
  post that the run ended (the server refuses it) and stops its worker;
  nothing here can do more.

``stop(config, store, run)`` stops each of these that the store records,
checks that it is gone (no process left; ``squeue`` no longer lists the job)
and says what it did. ``runs.end_run`` records a run's end only after that.
Stopping on a host runs ``potato/training/stop_job.py`` there, sent on
standard input; the flow's clean-up runs the same script through its own
connection (``stop_on_host``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from potato.config import BackendConfig, ProjectConfig
from potato.errors import BackendError
from potato.store import Run, Store
from potato.tasks.base import run_dir
from potato.tasks.openssh import Connection, SshTarget, remote_path, run_once, ssh_error, with_env
from potato.training.stop_job import processes

STOP_JOB_SOURCE = Path(__file__).resolve().parents[1] / "training" / "stop_job.py"
# How long the host may take to show the run's processes and SLURM job gone (a cluster's KillWait is 30 s).
HOST_WAIT_S = 45
LOCAL_WAIT_S = 5


@dataclass(frozen=True)
class Stopped:
    """Whether everything the run started is known to be gone, and what was done (or why it is not known)."""

    verified: bool
    said: str = ""


def _joined(parts: list[Stopped]) -> Stopped:
    return Stopped(all(p.verified for p in parts), "; ".join(p.said for p in parts if p.said))


def stop(config: ProjectConfig, store: Store, run: Run) -> Stopped:
    """Stop whatever *run* left running, on this machine and on its host; verify it is gone."""
    parts = [stop_local_worker(config, run)]
    remote = run.remote_socket or run.remote_job_dir or run.slurm_job_id
    if remote:
        backend = config.model_training.backends.get(run.backend)
        parts += [_stop_on_backend_host(backend, run), stop_local_ssh(run.remote_socket)]
    stopped = _joined(parts)
    if stopped.verified and remote:  # nothing left to stop there: later ends need not log in again
        store.update_run(run.id, remote_job_dir=None, remote_socket=None, slurm_job_id=None)
    return stopped


# ------------------------------------------------------------------ this machine


def _alive(pids: list[int]) -> list[int]:
    live = {pid for pid, _, _ in processes()}
    return [pid for pid in pids if pid in live]


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    left = _alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _alive(left)
    return left


def stop_local_worker(config: ProjectConfig, run: Run) -> Stopped:
    """SIGKILL the local worker's process group, if a process of it still runs this run's worker."""
    if not run.worker_pid:
        return Stopped(True)
    marker = str(run_dir(config, run.id))  # the worker's argv names its job directory, the run directory
    group = [(pid, cmdline) for pid, pgid, cmdline in processes() if pgid == run.worker_pid]
    if not any("potato.training.worker" in cmdline and marker in cmdline for _, cmdline in group):
        return Stopped(True)  # gone, or the group id was reused by someone else
    try:
        os.killpg(run.worker_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    left = _wait_gone([pid for pid, _ in group], LOCAL_WAIT_S)
    if left:
        return Stopped(False, f"the worker's process group {run.worker_pid} still runs (pids {left}) after SIGKILL")
    return Stopped(True, f"stopped the worker's process group {run.worker_pid} on this machine")


def stop_local_ssh(socket: str | None) -> Stopped:
    """End this machine's ssh processes of the run (its master, the client carrying the agent)."""
    if not socket:
        return Stopped(True)
    mine = [(pid, cmdline) for pid, _, cmdline in processes() if socket in cmdline and pid != os.getpid()]
    if not mine:
        return Stopped(True)
    for pid, cmdline in mine:
        _remove_private_dirs(cmdline)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    left = _wait_gone([pid for pid, _ in mine], 2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    left = _wait_gone(left, LOCAL_WAIT_S)
    if left:
        return Stopped(False, f"the run's ssh processes {left} on this machine do not exit")
    return Stopped(True, f"closed the run's ssh connection on this machine ({len(mine)} processes)")


def _remove_private_dirs(cmdline: str) -> None:
    """The master's control directory and the protocol socket's directory, both made by this machine."""
    for word in cmdline.replace(":", " ").split():
        directory = os.path.dirname(word)
        name = os.path.basename(directory)
        if os.path.dirname(directory) == tempfile.gettempdir() and name.startswith(("potato-ssh-", "potato-run-")):
            shutil.rmtree(directory, ignore_errors=True)


# ------------------------------------------------------------------ the host


def make_stop_spec(run: Run, *, remove: str = "all") -> dict:
    return {"job_dir": run.remote_job_dir or "", "socket": run.remote_socket or "",
            "slurm_job_id": run.slurm_job_id, "remove": remove, "wait_s": HOST_WAIT_S}


def _stop_on_backend_host(backend: BackendConfig | None, run: Run) -> Stopped:
    if backend is None or backend.type not in ("ssh", "slurm"):
        return Stopped(False, f"backend {run.backend!r} is no longer an ssh or slurm backend in the config, so "
                              f"Potato cannot log in to its host to stop the run's agent")
    remove = "none" if backend.get("keep_remote", False) else "all"
    return stop_on_host(SshTarget.from_backend(backend), backend.get("python", "python3"),
                        make_stop_spec(run, remove=remove))


def stop_on_host(target: SshTarget, python: str, spec: dict, connection: Connection | None = None) -> Stopped:
    """Run stop_job.py on the host (through *connection* if it is alive, else over an ssh of its own); read its report.

    Without a job directory no agent was started: only the socket file can be
    left, and not being able to remove it leaves nothing running.
    """
    def run(command: str, **kwargs):
        if connection is not None and connection.alive():
            return connection.run(command, **kwargs)
        return run_once(target, command, **kwargs)

    try:
        if not spec["job_dir"] and not spec["slurm_job_id"]:
            if spec["socket"]:
                run(f"rm -f {shlex.quote(spec['socket'])}", timeout=60)
            return Stopped(True)
        command = with_env(f"exec {remote_path(python)} - {shlex.quote(json.dumps(spec))}", target.env)
        done = run(command, input=STOP_JOB_SOURCE.read_bytes(), timeout=spec["wait_s"] + 60, check=False)
    except BackendError as exc:
        if not spec["job_dir"] and not spec["slurm_job_id"]:
            return Stopped(True)
        return Stopped(False, f"could not reach {target.host} to stop the run's agent and worker ({exc})")
    if done.returncode == 255:
        return Stopped(False, f"could not reach {target.host} to stop the run's agent and worker "
                              f"({ssh_error(target.host, done.stderr.decode(errors='replace'))})")
    output = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        report = json.loads(output[-1])
    except (ValueError, IndexError):
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return Stopped(False, f"{python} on {target.host} could not check the run's processes: {tail[0]}")
    return read_stop_report(target.host, report)


def read_stop_report(host: str, report: dict) -> Stopped:
    """What stop_job.py's report means: verified when nothing is left and the SLURM job has left the queue."""
    left, slurm, killed = report.get("left") or [], report.get("slurm") or {}, report.get("killed") or []
    if left:
        return Stopped(False, f"{len(left)} process(es) of the run still run on {host} after SIGKILL: {left[0][:200]}")
    if slurm.get("job") and not slurm.get("gone"):
        return Stopped(False, f"SLURM job {slurm['job']} is still in the queue ({slurm.get('state') or 'unknown'})")
    said = []
    if killed:
        said.append(f"killed {len(killed)} process(es) of the run on {host}")
    if slurm.get("cancelled"):
        said.append(f"cancelled SLURM job {slurm['job']} ({slurm.get('state')}); squeue no longer lists it")
    return Stopped(True, ", ".join(said))
