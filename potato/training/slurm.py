"""SLURM for the agent on a login node: job.sh, sbatch, squeue, scancel, scontrol.

The agent submits only the worker; the worker writes events.jsonl, stderr.log
and exit_code into the job directory on storage the login and compute nodes
share, and the agent reads them there. Potato never calls srun or sacct.

Pure builders and parsers on top; ``SlurmJob`` below is the only code that
runs SLURM's commands. Part of the remote half: Python 3.8, standard library.
"""

import re
import shlex
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from potato.training.job_paths import JobPaths, read_exit_code

# Backend key -> sbatch flag ("map to the sbatch flags of the same name").
SBATCH_FLAGS = {
    "partition": "--partition",
    "account": "--account",
    "qos": "--qos",
    "gres": "--gres",
    "time": "--time",
    "mem": "--mem",
    "cpus_per_task": "--cpus-per-task",
    "constraint": "--constraint",
}
COMMAND_TIMEOUT_S = 60
EXIT_SIGTERM = 143  # the worker's exit code after it stopped on SIGTERM

# scontrol's JobState -> why the job ended, and the slurm.out lines that say the same. First match wins:
# a job killed for its memory also says "CANCELLED AT" in slurm.out, and scontrol calls it FAILED
# (JobLaunchFailure) when slurmstepd's own memory watch (JobAcctGatherParams=OverMemoryKill) killed it.
END_REASONS = (
    ("TIMEOUT", ("DUE TO TIME LIMIT",), "it reached its time limit"),
    ("NODE_FAIL", ("DUE TO NODE FAILURE",), "its node failed"),
    ("PREEMPTED", ("DUE TO PREEMPTION",), "it was preempted by a job of higher priority"),
    ("OUT_OF_MEMORY", ("oom-kill", "Exceeded job memory limit"), "it ran out of memory (raise the backend's mem)"),
    ("CANCELLED", ("CANCELLED AT",), "it was cancelled with scancel outside Potato"),
    ("FAILED", (), "its batch script failed (see slurm.out and stderr.log in the job directory)"),
)
# squeue states of a job that has gone back to the queue after it ran: the scheduler requeued it.
REQUEUED_STATES = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")


# A newline in a value would end its line of job.sh and start a shell command
# of its own (a #SBATCH line is only a comment to bash); no value needs one.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class SlurmCommandError(Exception):
    """A SLURM command failed; the message quotes its last line of output."""


def make_sbatch_flags(config: Dict[str, Any]) -> List[str]:
    return ["{}={}".format(flag, config[key]) for key, flag in SBATCH_FLAGS.items() if config.get(key) not in (None, "")]


def check_job_values(config: Dict[str, Any], job_dir: str) -> None:
    """Raise ValueError naming the first value bound for job.sh that holds a control character.

    ``potato validate`` refuses them in a config already; this also covers a
    hand-started agent's ``--slurm-config``, which no validation has seen.
    """
    values = [(key, config.get(key)) for key in list(SBATCH_FLAGS) + ["job_python", "code_dir"]]
    values += [("prelude[{}]".format(i), line) for i, line in enumerate(config.get("prelude") or [])]
    values.append(("the job directory", job_dir))
    for name, value in values:
        if isinstance(value, str) and _CONTROL.search(value):
            raise ValueError("The slurm setting {} is {!r}: it holds a control character, which would break "
                             "job.sh into shell lines of its own; remove it".format(name, value))


def make_job_script(config: Dict[str, Any], job_dir: str, run_id: Any) -> str:
    """job.sh: the #SBATCH lines, the prelude, then ``exec`` the worker.

    ``exec``: a batch shell that keeps running beside Python dies on
    ``scancel --signal=TERM`` before the worker can stop cleanly (measured).
    Raises ValueError for a value with a control character (``check_job_values``).
    """
    check_job_values(config, job_dir)
    q = shlex.quote
    lines = ["#!/bin/bash", "#SBATCH --job-name={}".format(q("potato-run-{}".format(run_id))),
             "#SBATCH --output={}".format(q(JobPaths(job_dir).slurm_out)),
             "#SBATCH --open-mode=append",
             # A requeued job would start the worker over; Potato reports the preemption instead.
             "#SBATCH --no-requeue"]
    lines += ["#SBATCH {}".format(q(flag)) for flag in make_sbatch_flags(config)]
    lines += list(config.get("prelude") or [])
    lines += [
        "cd {}".format(q(job_dir)),
        # Said here, not inherited: some clusters submit with SBATCH_EXPORT=NONE.
        "export PYTHONPATH={}".format(q(config["code_dir"])) if config.get("code_dir") else ":",
        "exec {} -m potato.training.worker {} 2>>{}".format(
            q(config["job_python"]), q(job_dir), q(JobPaths(job_dir).stderr)),
    ]
    return "\n".join(lines) + "\n"


def parse_sbatch(output: str) -> str:
    """The job id from ``sbatch --parsable`` (``id`` or ``id;cluster``)."""
    first = output.strip().split(";", 1)[0]
    if not first.isdigit():
        raise SlurmCommandError("Could not make sense of sbatch output {!r}".format(output.strip()))
    return first


def squeue_argv(job_id: str) -> List[str]:
    return ["squeue", "--noheader", "--jobs", job_id, "--format", "%T|%r|%N"]


def parse_squeue(output: str) -> Optional[Tuple[str, str, str]]:
    """(state, reason, node) of the job, or None once it has left the queue."""
    for line in output.splitlines():
        if line.strip():
            state, _, rest = line.strip().partition("|")
            reason, _, node = rest.partition("|")
            return state, reason, node
    return None


def describe_queue_state(job_id: str, state: str, reason: str, node: str) -> str:
    if state == "RUNNING" and node:
        return "SLURM job {}: RUNNING on {}".format(job_id, node)
    if reason and reason != "None":
        return "SLURM job {}: {} ({})".format(job_id, state, reason)
    return "SLURM job {}: {}".format(job_id, state)


def parse_scontrol(output: str) -> Dict[str, str]:
    """``scontrol show job`` as a dict of its KEY=VALUE words."""
    fields = {}
    for word in output.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def explain_end(scontrol: Optional[Dict[str, str]], slurm_out: str) -> str:
    """Why the scheduler ended a job before the worker finished, from scontrol or slurm.out."""
    state = (scontrol or {}).get("JobState", "")
    if (scontrol or {}).get("Reason") == "TimeLimit":  # still COMPLETING, but already judged
        state = "TIMEOUT"
    for job_state, lines, reason in END_REASONS:
        if state == job_state or any(line in slurm_out for line in lines):
            if job_state == "FAILED":  # job.sh execs the worker: a signal that ended the job ended the worker
                signal = (scontrol or {}).get("ExitCode", "").partition(":")[2]
                if signal.isdigit() and int(signal):
                    return "its worker was killed by signal {}".format(signal)
            return reason
    if state:
        return "the scheduler ended it ({})".format(state)
    return "it left the queue without a word in slurm.out"


class SlurmJob:
    """One submitted worker: its queue state, its end, its cancel."""

    def __init__(self, config: Dict[str, Any], job_dir: str, run_id: Any, log: Callable[[str], None],
                 run: Callable[..., "subprocess.CompletedProcess"] = None, env: Optional[Dict[str, str]] = None):
        self.config = config
        self.job_dir = job_dir
        self.log = log
        # sbatch hands the job the environment it runs in (--export=ALL): *env* is what the job may see.
        self._run = run or (lambda argv: _run(argv, env))
        self.poll_interval = float(config.get("poll_interval_s") or 10)
        script = JobPaths(job_dir).job_script
        with open(script, "w", encoding="utf-8") as fh:
            fh.write(make_job_script(config, job_dir, run_id))
        done = self._run(["sbatch", "--parsable", script])
        self.job_id = parse_sbatch(done.stdout)
        with open(JobPaths(job_dir).slurm_job_id, "w") as fh:  # for the server's clean-up
            fh.write(self.job_id + "\n")
        self.log("Submitted SLURM job {} with {}".format(
            self.job_id, " ".join(make_sbatch_flags(config)) or "no flags"))
        self._next_check = 0.0
        self._last_state = None  # type: Optional[str]
        self._ran = False
        self.gone = False
        self.cancelling = False

    def poll(self) -> Optional[int]:
        """The worker's exit code once it has one; raises SlurmCommandError when the job ended without."""
        code = read_exit_code(self.job_dir)
        if code is not None:
            return self._checked(code)
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + self.poll_interval
        try:
            queued = parse_squeue(self._run(squeue_argv(self.job_id)).stdout)
        except SlurmCommandError as exc:
            # Status may be stale for a while (a busy controller); keep the last known state.
            self.log("squeue failed ({}); SLURM job {} last seen {}".format(exc, self.job_id, self._last_state))
            return None
        if queued is not None:
            text = describe_queue_state(self.job_id, *queued)
            if text != self._last_state:
                self._last_state = text
                self.log(text)
            if queued[0] == "RUNNING":
                self._ran = True
            elif self._ran and queued[0] in REQUEUED_STATES:
                raise self._requeued()
            return None
        self.gone = True
        code = read_exit_code(self.job_dir)  # the worker may have ended between the two reads
        if code is not None:
            return self._checked(code)
        raise self._ended_early()

    def _checked(self, code: int) -> int:
        """A worker stopped by SIGTERM that Potato did not send was stopped by the scheduler."""
        if code == EXIT_SIGTERM and not self.cancelling:
            raise self._ended_early()
        return code

    def _requeued(self) -> SlurmCommandError:
        """A job back in the queue after it ran would start the worker over: one run, one worker, so it goes."""
        self._cancel(["scancel", self.job_id])
        return SlurmCommandError("SLURM job {} was requeued by the scheduler after it had started; Potato runs a "
                                 "run's worker once, so it cancelled the job".format(self.job_id))

    def _ended_early(self) -> SlurmCommandError:
        scontrol = self._scontrol() or {}
        # A requeue SIGTERMs the worker first: its exit code can arrive before squeue shows the job pending again.
        if scontrol.get("JobState") in REQUEUED_STATES or scontrol.get("Restarts", "0") not in ("", "0"):
            return self._requeued()
        return SlurmCommandError("SLURM job {} ended before the worker finished: {}".format(
            self.job_id, explain_end(scontrol, _read(JobPaths(self.job_dir).slurm_out))))

    def _scontrol(self) -> Optional[Dict[str, str]]:
        try:
            return parse_scontrol(self._run(["scontrol", "show", "job", self.job_id]).stdout)
        except (SlurmCommandError, OSError):
            return None  # no scontrol, or the job is purged: slurm.out must tell

    def signal_term(self) -> None:
        self.cancelling = True
        self._cancel(["scancel", "--full", "--signal=TERM", self.job_id])

    def stop(self, grace: float) -> Optional[int]:
        """TERM to the batch step and its children, then a plain scancel after *grace* seconds."""
        if not self.gone:
            self.signal_term()
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if read_exit_code(self.job_dir) is not None or self._left_queue():
                    break
                time.sleep(0.5)
            else:
                self.log("SLURM job {} still ran {:g} s after SIGTERM; scancel".format(self.job_id, grace))
            self._cancel(["scancel", self.job_id])
        code = read_exit_code(self.job_dir)
        return 143 if code is None else code

    def _left_queue(self) -> bool:
        try:
            return parse_squeue(self._run(squeue_argv(self.job_id)).stdout) is None
        except SlurmCommandError:
            return False

    def _cancel(self, argv: List[str]) -> None:
        try:
            self._run(argv)
        except SlurmCommandError as exc:
            self.log("{} failed: {}".format(" ".join(argv), exc))


def _run(argv: List[str], env: Optional[Dict[str, str]] = None) -> "subprocess.CompletedProcess":
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=COMMAND_TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmCommandError("{}: {}".format(argv[0], exc)) from exc
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmCommandError(lines[-1] if lines else "{} exited with {}".format(argv[0], done.returncode))
    return done


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""
