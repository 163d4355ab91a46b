"""Every exception Potato's training code raises on purpose.

Importable without I/O. The tree::

    PotatoError                 anything Potato reports to a user as a message
    ├── ConfigError             the config file is missing, unreadable or invalid
    │   └── ConfigNotAllowed    a Prefect flow run names a config its deployments' allow-list lacks
    ├── ProjectDataError        items or labels cannot be read (file and line named)
    ├── StoreError              the run store refuses an operation (bad field, bad value, newer schema)
    │   ├── UnknownRun          no run has that id                         (HTTP 404)
    │   ├── RunEnded            the run already ended; it takes no more    (HTTP 409)
    │   └── StoreBusy           another writer held the lock too long      (HTTP 503, retried)
    ├── RunRequestError         a run request names an unknown trainer or schema, or a misfit  (HTTP 400)
    │   ├── UnknownBackendError   it names a backend the config lacks      (HTTP 409)
    │   ├── UnknownTrainerError   it names a trainer that is not registered (HTTP 400)
    │   └── LocalOnlyTrainerError a trainer that runs only here, elsewhere (HTTP 409)
    ├── RunError                a run ends failed with a message meant for the user
    │   ├── HeartbeatTimeout    the worker or agent sent nothing for heartbeat_timeout_s
    │   ├── WallTimeExceeded    the run passed model_training.max_wall_seconds
    │   ├── RunCancelled        a cancel was requested and carried out
    │   ├── NoPrefectWorker     no Prefect worker started a deployment's run in time
    │   └── NotThisFlowRun      a flow run was given a run another flow run (or process) executes
    ├── DiskFull                the disk holding the run directory is full
    ├── BackendError            a backend cannot do what a run needs
    │   ├── SshError            the OpenSSH client failed (exit 255)
    │   │   └── ConnectionLost  a run's ssh connection dropped while the run was active
    │   ├── RemoteCommandError  a remote command ran and failed
    │   ├── RemoteDirNotWritable  the host's account cannot write remote_dir
    │   ├── GpuQueryHung        nvidia-smi on the host did not answer
    │   ├── NoFreeGpu           gpus: auto finds no GPU with min_free_gpu_mb (or the run's estimate) free
    │   ├── NoKernels           the host's torch has kernels for none of its GPUs
    │   ├── SlurmError          sbatch/squeue/scancel/scontrol failed or the job ended early
    │   │   └── MissingSlurmCommand  the login node has no sbatch/squeue/scancel on PATH
    │   └── AgentError          an agent broke the protocol or was not there
    │       └── NoAgent         no agent claimed a run within queue_timeout_s
    ├── TokenError              an agent token cannot be issued for that backend
    ├── TrainerError            a trainer cannot be imported or its options are wrong
    │   └── TrainerImportError  its packages are missing from the interpreter
    ├── CalibrationError        decision-calibrate has no run it can calibrate
    ├── WritebackError          the writeback file cannot be written, or the run's bundle is gone
    │   └── LiveWritebackError  the items' own records cannot take the predictions (whose field, a write)
    ├── RetractError            a run's predictions cannot be retracted (it has none to retract)
    ├── PrefectApiError         the embedded Prefect API cannot be started or reached
    └── ParseError              a tool's output made no sense (the raw text is quoted)

A message a user reads for a common failure is built in exactly one place:
the ``__init__`` of the class named for it.
"""

from __future__ import annotations

import shlex
from typing import Iterable

from potato.closest_name import did_you_mean
from potato.training.trainers.registry import import_failure_message
from potato.training.escaping import quote
from potato.training.safe_paths import MAX_NAME_BYTES


class PotatoError(Exception):
    """Raised when something goes wrong that a user should read about."""


class ConfigError(PotatoError):
    """Raised when the config file is missing, unreadable or invalid."""


class ConfigNotAllowed(ConfigError):
    """Raised when a flow run's ``config`` parameter is not in the allow-list ``deployments.create`` keeps."""

    def __init__(self, config: str, allowed: list[str], allow_list: str):
        shown = quote(config, MAX_NAME_BYTES)  # a path is named whole, as long as a path can be
        listed = ", ".join(map(repr, allowed)) or "none"  # the operator's own list
        super().__init__(
            f"The config {shown} is not one this Prefect deployment trains ({allow_list} allows {listed}); "
            f"nothing was read. If it should be, add it on the worker's host: python -m deployments.create "
            f"--allow-config {shown}")


class ProjectDataError(PotatoError):
    """Raised when items or labels cannot be read; the message names file and line."""


class StoreError(PotatoError):
    """Raised when the run store refuses an operation."""


class TrackerError(PotatoError):
    """Raised when an experiment tracker cannot take a run's report: what it refused, or why it could not be
    reached, in words that name the fix. The run goes on: its log keeps it as a warning."""


class CompareError(PotatoError):
    """Raised when what was asked cannot be compared side by side: fewer than two runs, too many, or one
    named twice."""


class UnknownRun(StoreError):
    """Raised when no run has the id asked for; *config*, where known, is named in the command that lists them."""

    def __init__(self, run_id: object, config: object = None):
        self.run_id = run_id
        where = shlex.quote(str(config)) if config else "config.yaml"
        super().__init__(f"No run with id {run_id!r}; list the project's runs with: potato training runs {where}")


class RunEnded(StoreError):
    """Raised when something is recorded for a run that has already ended."""

    def __init__(self, run_id: int, state: str):
        self.run_id = run_id
        self.state = state
        super().__init__(f"Run {run_id} already ended ({state}); it takes nothing more")


class StoreBusy(StoreError):
    """Raised when another writer held the store's lock for longer than the busy timeout.

    Transient: the same request succeeds once the other writer is done, so the
    server answers 503 with Retry-After and agents try again.
    """


class RunRequestError(PotatoError):
    """Raised when a run request names an unknown trainer or schema, or a trainer that cannot train it."""


class UnknownBackendError(RunRequestError):
    """Raised when a run request (or ``potato training check``) names a backend not in the config."""

    def __init__(self, name: str, known: Iterable[str]):
        self.name = name
        self.known = sorted(known)
        super().__init__(f"No backend named {name!r} in model_training.backends"
                         f"{_suggested(name, self.known, 'backends')}")


class UnknownTrainerError(RunRequestError):
    """Raised when a run request names a trainer that is not registered."""

    def __init__(self, name: str, known: Iterable[str]):
        self.name = name
        self.known = sorted(known)
        super().__init__(f"Unknown trainer {name!r}{_suggested(name, self.known, 'trainers')}")


def _suggested(name: str, known: list[str], what: str) -> str:
    """``; did you mean `gpu-server`? Known backends: …`` for a near miss, else ``; known backends: …``."""
    guess = did_you_mean(name, known)
    listed = ", ".join(known)
    return f"{guess} Known {what}: {listed}" if guess else f"; known {what}: {listed}"


class LocalOnlyTrainerError(RunRequestError):
    """Raised when a trainer that runs only on this machine is asked for on another backend.

    *what* names the backend's type with its article (``an ssh backend``);
    *why* is the trainer's declared reason (``potato.training.trainers.registry``).
    """

    def __init__(self, trainer: str, backend: str, what: str, why: str):
        self.trainer, self.backend = trainer, backend
        super().__init__(f"Trainer {trainer!r} runs only on the local backend, and {backend!r} is {what}: {why}")


class RunError(PotatoError):
    """Raised when a run ends failed with a message meant for its user."""


class HeartbeatTimeout(RunError):
    """Raised when the worker or agent sent nothing for ``heartbeat_timeout_s``."""

    def __init__(self, backend: str, seconds: float, *, agent: bool = True):
        self.backend = backend
        self.seconds = seconds
        who = "the agent" if agent else "the worker"
        super().__init__(f"No word from {who} on {backend} for {seconds:g} seconds")


class WallTimeExceeded(RunError):
    """Raised when a run passes ``model_training.max_wall_seconds``."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        super().__init__(
            f"The run was stopped after {seconds:g} seconds: it reached "
            f"model_training.max_wall_seconds ({seconds:g})"
        )


class RunCancelled(RunError):
    """Raised when a cancel was requested and the run was stopped."""

    def __init__(self, message: str = "Cancelled"):
        super().__init__(message)


class NotThisFlowRun(RunError):
    """Raised when a flow run is given (``run_id``) a run that another flow run or flow process executes.

    A Prefect "Custom run", a second ``prefect deployment run --param run_id=N``
    or a copy of a dispatched flow run would otherwise write itself onto run N
    and then cancel or fail it; it changes nothing and fails instead.
    """

    def __init__(self, run_id: int, flow_run_id: str | None, *, owner: str | None = None, pid: int | None = None):
        self.run_id = run_id
        self.owner = owner
        whose = f"flow run {owner} (run-{run_id} in the Prefect UI)" if owner else f"the flow process {pid}"
        super().__init__(
            f"Run {run_id} belongs to {whose}; this flow run ({flow_run_id}) changed nothing and stops. To train "
            "again, start a new run (the Training page, potato training run, or prefect deployment run without "
            "run_id)")


class NoPrefectWorker(RunError):
    """Raised when no Prefect worker started a run handed to a work pool within ``max_wall_seconds``."""

    def __init__(self, run_id: int, pool: str | None, seconds: float):
        self.run_id = run_id
        self.pool = pool
        self.seconds = seconds
        where = f"work pool {pool!r}" if pool else "its work pool"
        start = f"prefect worker start --pool {pool}" if pool else "prefect worker start --pool <pool>"
        super().__init__(
            f"No Prefect worker started run {run_id} within {seconds:g} seconds of its queueing on {where} "
            f"(model_training.max_wall_seconds); start one on the annotation server's host: {start}")


class DiskFull(PotatoError):
    """Raised when the disk holding a run's directory is full (ENOSPC)."""

    def __init__(self, path: object):
        self.path = path
        super().__init__(
            f"The disk holding {path} is full (No space left on device). Fix: free space on it, or move "
            f"output_annotation_dir to a disk with room, then start the run again")


class BackendError(PotatoError):
    """Raised when a backend cannot do what a run needs."""


class SshError(BackendError):
    """Raised when the OpenSSH client itself fails (exit status 255)."""


class ConnectionLost(SshError):
    """Raised when a run's ssh connection (its ControlMaster) drops while the run is active."""

    def __init__(self, host: str, reason: str, *, copying: bool = False):
        self.host = host
        if copying:
            super().__init__(
                f"The ssh connection to {host} was lost while the model was copied back ({reason}); the run's "
                f"predictions are saved; only model files are missing from artifacts/")
        else:
            super().__init__(
                f"The ssh connection to {host} was lost during the run ({reason}); the agent there stops its "
                f"worker when its connection ends, and Potato checks that nothing of the run is left there before "
                f"it ends")


class RemoteCommandError(BackendError):
    """Raised when a remote command ran and exited non-zero."""


class RemoteDirNotWritable(BackendError):
    """Raised when the account Potato logs in as cannot write the backend's ``remote_dir``."""

    def __init__(self, host: str, user: str, remote_dir: str):
        super().__init__(
            f"remote_dir {remote_dir} on {host} is not writable by {user}, and Potato keeps its code and the "
            f"runs' job directories there. Fix: set the backend's remote_dir to a directory {user} can write "
            f"(the default is ~/.cache/potato-training)")


class GpuQueryHung(BackendError):
    """Raised when ``nvidia-smi`` on an ssh host does not answer, so no GPU can be chosen."""

    def __init__(self, host: str, seconds: float):
        super().__init__(
            f"nvidia-smi on {host} did not answer within {seconds:g} s, so Potato cannot tell which GPU is free "
            f"(a hung GPU driver?). Fix: check the host's GPUs (`ssh {host} nvidia-smi` must answer), or set "
            f"the backend's gpus to none to train on its CPU")


class NoFreeGpu(BackendError):
    """Raised when ``gpus: auto`` finds no GPU with ``min_free_gpu_mb`` free, or with the memory the run's
    trainer estimates it needs when that is more (*needed_by* then says whose estimate)."""

    def __init__(self, min_free_mb: int, needed_by: str = ""):
        if needed_by:
            super().__init__(
                f"No GPU has {min_free_mb} MB free ({needed_by}). Fix: wait, set trainer options that need less "
                f"memory, or pin a GPU with gpus: \"1\" (`potato training check <backend> config.yaml` lists the "
                f"GPUs and the estimate)")
            return
        super().__init__(
            f"No GPU has {min_free_mb} MB free. Fix: wait, lower min_free_gpu_mb, or pin a GPU with "
            f"gpus: \"1\" (`potato training check <backend> config.yaml` lists the GPUs)")


class NoKernels(BackendError):
    """Raised when the host's torch has kernels for none of its GPUs."""

    def __init__(self):
        super().__init__(
            "This host's torch has no kernels for any of its GPUs. Fix: install a torch build for these "
            "GPUs there, or point the backend's python at an interpreter that has one")


class SlurmError(BackendError):
    """Raised when a SLURM command fails or the scheduler ends a job early."""


class MissingSlurmCommand(SlurmError):
    """Raised when a login node lacks sbatch, squeue or scancel on PATH."""

    def __init__(self, host: str, command: str):
        self.host = host
        self.command = command
        super().__init__(
            f"{host} has no {command} on PATH, so it cannot submit jobs. Fix: if {host} is the cluster's login "
            f"node and {command} is on a PATH only a login shell sets, set PATH under the backend's env")


class AgentError(BackendError):
    """Raised when an agent breaks the protocol or is not there."""


class NoAgent(AgentError):
    """Raised when no agent claims a run within ``queue_timeout_s``."""

    def __init__(self, backend: str, seconds: float):
        super().__init__(
            f"No agent asked for work on backend {backend!r} within {seconds:g} s. Fix: start one on the "
            f"training machine with `potato training agent --server URL --backend {backend}` "
            f"(its token comes from `potato training register {backend} config.yaml`)")


class TokenError(PotatoError):
    """Raised when a token cannot be issued for a backend (unknown, or not an agent backend)."""


class TrainerError(PotatoError):
    """Raised when a trainer cannot be imported or is given wrong options."""


class TrainerImportError(TrainerError):
    """Raised when a trainer's packages are missing from the interpreter."""

    def __init__(self, trainer: str, missing: str, *, fix: str | None = None):
        self.trainer = trainer
        self.missing = missing
        text = import_failure_message(trainer, missing)
        super().__init__(f"{text}. Fix: {fix}" if fix else text)


class CalibrationError(PotatoError):
    """Raised when decision-calibrate has no run it can calibrate; the message says why and what to do."""


class WritebackError(PotatoError):
    """Raised when the writeback file cannot be written, or the run's bundle is gone."""


class LiveWritebackError(WritebackError):
    """Raised when the live writeback cannot change the items' records: a record holds the field already
    (before its first writeback), or the directory's lock or a file cannot be had."""


class RetractError(PotatoError):
    """Raised when a run's predictions cannot be retracted: no such run, or it made none to retract."""


class PromoteError(PotatoError):
    """Raised when a run's predictions cannot be promoted past the quality gate: no such run, or none to show."""


class PrefectApiError(PotatoError):
    """Raised when the embedded Prefect API cannot be started or reached."""


class ParseError(PotatoError):
    """Raised when a tool's output makes no sense; the message quotes it."""

    def __init__(self, tool: str, raw: str):
        self.tool = tool
        self.raw = raw
        super().__init__(f"Could not make sense of {tool} output {raw!r}")
