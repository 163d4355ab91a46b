"""Stop what a run left on a host, and say what is left: ``python - SPEC < stop_job.py``.

The server runs this over ssh whenever an ssh or slurm run ends: from its
flow's clean-up, and from reconciliation when the flow is gone (killed with
-9: then the agent and its worker may still run, and the next run must not
start beside them). SPEC is a JSON object:

    {"job_dir": "/home/u/.cache/potato-training/jobs/7-1a2b3c4d" or "",
     "socket": "/tmp/potato-7-0123456789ab.sock" or "",
     "slurm_job_id": "4242" or null, "remove": "all" | "bundle" | "none", "wait_s": 45}

What it does, in order: SIGKILL to the agent (``agent.pid``) and the
worker's process group (``worker.pid``) while their command lines still name
this job (pids get reused), then to every process whose command line names
the job directory or the socket; ``scancel`` of the SLURM job (the id given,
or ``slurm_job_id`` in the job directory); then it waits until no such
process is left and ``squeue`` no longer lists the job. Only then are the
socket and the job directory removed (``remove``), and only paths shaped the
way Potato makes them, so a damaged record can never aim ``rm -rf`` elsewhere.

It prints one JSON line: ``{"killed": [command lines], "left": [command
lines still running], "slurm": {"job": id, "gone": bool, "cancelled": bool,
"state": "…"}, "removed": [paths]}``.
Stopping is verified when ``left`` is empty and the job (if any) is gone.

Part of the remote half: Python 3.8, standard library only; sent on standard
input, so it runs whatever version of Potato's code the host has.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

JOB_DIR_SHAPE = re.compile(r".*/jobs/\d+-[0-9a-f]{8}")
# Files of the job directory (potato/training/job_paths.py names them; this runs alone, so it spells them).
AGENT_PID, WORKER_PID, SLURM_JOB_ID, BUNDLE = "agent.pid", "worker.pid", "slurm_job_id", "bundle"
SOCKET_SHAPE = re.compile(r"/tmp/potato-\d+-[0-9a-f]{12}\.sock")
SQUEUE_GONE = "Invalid job id"


def processes() -> List[Tuple[int, int, str]]:
    """(pid, process group, command line) of every live process of this account; zombies left out.

    Only this account's: they are the only ones it can signal, and a host may
    also be the machine that runs the server, whose own ssh processes name the
    same socket.
    """
    uid = os.getuid()
    found = []
    if os.path.isdir("/proc/self"):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat("/proc/" + entry).st_uid != uid:
                    continue
                with open("/proc/{}/stat".format(entry), "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
                with open("/proc/{}/cmdline".format(entry), "rb") as fh:
                    cmdline = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            except (OSError, IndexError):
                continue
            if fields[0] != b"Z":
                found.append((int(entry), int(fields[2]), cmdline))
        return found
    done = subprocess.run(["ps", "-A", "-o", "uid=", "-o", "pid=", "-o", "pgid=", "-o", "stat=", "-o", "args="],
                          stdout=subprocess.PIPE, universal_newlines=True, timeout=30)
    for line in done.stdout.splitlines():
        parts = line.split(None, 4)
        if len(parts) == 5 and parts[0] == str(uid) and not parts[3].startswith("Z"):
            found.append((int(parts[1]), int(parts[2]), parts[4]))
    return found


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _kill(pid: int, group: bool = False) -> None:
    try:
        if group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


def marked(markers: List[str]) -> List[Tuple[int, int, str]]:
    me = os.getpid()
    return [p for p in processes() if p[0] != me and any(m in p[2] for m in markers)]


def kill_all(job_dir: str, markers: List[str]) -> List[str]:
    """SIGKILL the run's agent, its worker's group, and whatever else names the job or the socket."""
    named = {pid: cmdline for pid, _, cmdline in marked(markers)} if markers else {}
    for name, group in ((AGENT_PID, False), (WORKER_PID, True)):
        pid = _read(os.path.join(job_dir, name)) if job_dir else ""
        if pid.isdigit() and int(pid) in named:
            _kill(int(pid), group)
    for pid in named:
        _kill(pid)
    return sorted(named.values())


def squeue_state(job_id: str) -> Optional[str]:
    """The job's state in the queue, or None once ``squeue`` no longer lists it."""
    done = subprocess.run(["squeue", "--noheader", "--jobs", job_id, "--format", "%T"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    if SQUEUE_GONE in done.stderr or (done.returncode == 0 and not done.stdout.strip()):
        return None
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["squeue exited with {}".format(done.returncode)])[-1])
    return done.stdout.strip()


def cancel_slurm_job(job_id: str, deadline: float) -> Dict[str, Any]:
    """``scancel`` the job if the queue still lists it, then wait until it no longer does (or *deadline*)."""
    if not job_id.isdigit():
        return {"job": None, "gone": True, "cancelled": False, "state": ""}
    try:
        state = squeue_state(job_id)
        if state is None:
            return {"job": job_id, "gone": True, "cancelled": False, "state": ""}
        subprocess.run(["scancel", job_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        while True:
            now = squeue_state(job_id)
            if now is None or time.monotonic() > deadline:
                return {"job": job_id, "gone": now is None, "cancelled": True, "state": now or state}
            time.sleep(0.5)
    except (OSError, subprocess.TimeoutExpired, RuntimeError) as exc:
        return {"job": job_id, "gone": False, "cancelled": False, "state": "{}: {}".format(type(exc).__name__, exc)}


def remove(spec: Dict[str, Any]) -> List[str]:
    """Remove the socket and the job directory (or its bundle), if shaped as Potato makes them."""
    removed = []
    socket, job_dir, what = spec.get("socket") or "", spec.get("job_dir") or "", spec.get("remove", "all")
    if SOCKET_SHAPE.fullmatch(socket) and os.path.lexists(socket):
        os.unlink(socket)
        removed.append(socket)
    if JOB_DIR_SHAPE.fullmatch(job_dir) and what in ("all", "bundle"):
        target = job_dir if what == "all" else os.path.join(job_dir, BUNDLE)
        if os.path.lexists(target):
            shutil.rmtree(target, ignore_errors=True)
            removed.append(target)
    return removed


def stop(spec: Dict[str, Any]) -> Dict[str, Any]:
    job_dir, socket = spec.get("job_dir") or "", spec.get("socket") or ""
    deadline = time.monotonic() + float(spec.get("wait_s") or 45)
    job_id = str(spec.get("slurm_job_id") or (_read(os.path.join(job_dir, SLURM_JOB_ID)) if job_dir else ""))
    markers = [m for m in (job_dir, socket) if m]
    killed = kill_all(job_dir, markers)
    slurm = cancel_slurm_job(job_id, deadline)
    left = marked(markers) if markers else []
    while left and time.monotonic() < deadline:
        for pid, _, _ in left:
            _kill(pid)
        time.sleep(0.2)
        left = marked(markers)
    report = {"killed": killed, "left": [cmdline for _, _, cmdline in left], "slurm": slurm, "removed": []}
    if not left and slurm["gone"]:
        report["removed"] = remove(spec)
    return report


if __name__ == "__main__":
    print(json.dumps(stop(json.loads(sys.argv[1]))))
