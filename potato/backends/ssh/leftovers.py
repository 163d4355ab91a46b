"""Stop what an ssh or slurm run left running, on its host and on this machine, and prove it is gone.

On this machine, the run's ssh ControlMaster and the ssh client carrying
the agent (each in a session of its own, or orphaned when the flow dies:
they outlive it); on the host, the agent, the worker's process group and a
SLURM job. The store records what to look for: ``remote_socket`` (before
connecting), ``remote_job_dir`` (before the job directory exists) and
``slurm_job_id`` (once the agent has submitted; also in the job directory).
Stopping on the host runs ``potato/training/stop_job.py`` there, sent on
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
from pathlib import Path

from potato import training
from potato.backend_types.contract import Stopped
from potato.backends.ssh.openssh import Connection, SshTarget, remote_path, run_once, ssh_error, with_env
from potato.config import BackendConfig, ProjectConfig
from potato.errors import BackendError
from potato.runs.stopping import LOCAL_WAIT_S, joined, wait_gone
from potato.runs.store import Run, Store
from potato.training.stop_job import processes

STOP_JOB_SOURCE = Path(training.__file__).with_name("stop_job.py")
# How long the host may take to show the run's processes and SLURM job gone (a cluster's KillWait is 30 s).
HOST_WAIT_S = 45


def stop_leftovers(config: ProjectConfig, store: Store, run: Run) -> Stopped:
    """Stop what *run* left on its host and this machine's ssh processes of it; verify both are gone."""
    if not (run.remote_socket or run.remote_job_dir or run.slurm_job_id):
        return Stopped(True)
    backend = config.model_training.backends.get(run.backend)
    stopped = joined([_stop_on_backend_host(backend, run), stop_local_ssh(run.remote_socket)])
    if stopped.verified:  # nothing left to stop there: later ends need not log in again
        store.update_run(run.id, remote_job_dir=None, remote_socket=None, slurm_job_id=None)
    return stopped


# ------------------------------------------------------------------ this machine


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
    left = wait_gone([pid for pid, _ in mine], 2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    left = wait_gone(left, LOCAL_WAIT_S)
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
    if backend is None or not backend.type_info.over_ssh:
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
