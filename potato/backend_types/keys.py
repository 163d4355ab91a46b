"""Keys that more than one backend type has, declared once (``potato.config_keys.Key``)."""

from __future__ import annotations

from potato.config_keys import Key

TYPE = Key("type", "str", "the backend's type: ssh, slurm or agent", required=True)
DESCRIPTION = Key("description", "str", "free text")
USER = Key("user", "str", "passed to ssh as `-l`")
PORT = Key("port", "int", "passed to ssh as `-p`", minimum=1, maximum=65535)
IDENTITY_FILE = Key("identity_file", "str", "passed to ssh as `-i`")
ENV = Key("env", "mapping str->str", "environment for remote commands (e.g. `PATH`)", default={})
NUM_THREADS = Key(
    "num_threads", "int",
    "sets `OMP_NUM_THREADS`, `MKL_NUM_THREADS`, `OPENBLAS_NUM_THREADS`, overriding a login shell's value",
    minimum=1,
)
MAX_ARTIFACT_MB = Key(
    "max_artifact_mb", "int", "files larger than this stay on the host and are named in the run log",
    default=2048, minimum=0,
)
FETCH_ARTIFACTS = Key("fetch_artifacts", "bool", "copy the model files back to the server", default=True)
KEEP_REMOTE = Key("keep_remote", "bool", "keep the remote job directory for inspection", default=False)
COPY_STALL = Key(
    "copy_stall_timeout_s", "float",
    "a model copy from the host that sends nothing for this long fails (predictions are already saved)",
    default=180, minimum=1,
)
HEARTBEAT = Key(
    "heartbeat_timeout_s", "float", "a run whose agent sends nothing for this long fails",
    minimum=1, default_text="`120` (`model_training.heartbeat_timeout_s`)",
)
PROCESSES_MEANING = (
    "training processes, data-parallel (torch's launcher): on GPUs one per GPU, at most as many as the run "
    "has; on the CPU this many processes sharing the threads (gloo), e.g. to try the multi-GPU path without GPUs"
)
