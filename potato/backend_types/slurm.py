"""The ``slurm`` backend type: compute nodes behind a SLURM login node.

Potato logs in to the login node as for ssh (the same steps, against it) and
starts the agent there, which submits the worker with ``sbatch`` into a job
directory on storage the compute nodes share. The steps are in ``steps.py``,
``potato training check`` in ``check.py``.
"""

from __future__ import annotations

import posixpath
from typing import Any, Mapping

from potato.backend_types import keys
from potato.backend_types.contract import BackendType
from potato.config_keys import Issues, Key, parse_slurm_time

# Node-local directories: a job on another node would not see the bundle.
NODE_LOCAL_DIRS = ("/tmp", "/var/tmp")
LONG_JOB_S = 6 * 3600
_GRES_NOT_GPUS = "the scheduler assigns GPUs; ask for them with gres (e.g. gres: gpu:1)"


def under_node_local_dir(remote_dir: str) -> str | None:
    """The node-local directory *remote_dir* is in (``/tmp``, ``/var/tmp``), or None."""
    normal = posixpath.normpath(remote_dir)
    return next((d for d in NODE_LOCAL_DIRS if normal == d or normal.startswith(d + "/")), None)


def check_rules(options: Mapping[str, Any], path: str, issues: Issues) -> None:
    """``remote_dir`` on shared storage; a warning for a ``time`` over 6 hours."""
    remote_dir = options.get("remote_dir")
    local_dir = under_node_local_dir(remote_dir) if isinstance(remote_dir, str) else None
    if local_dir:
        issues.error(f"{path}.remote_dir", f"{path}.remote_dir is {remote_dir!r}, which is under "
                     f"{local_dir}, a directory local to each node; use a directory on "
                     "storage the compute nodes share")
    time = options.get("time")
    if time is not None:
        seconds = parse_slurm_time(time)
        if seconds is None or seconds > LONG_JOB_S:
            issues.warn(f"{path}.time", f"{path}.time is {time}. A job that holds a GPU for more "
                        "than 6 hours is long on a shared cluster; check its policy")


SLURM = BackendType(
    name="slurm", menu="{name} (slurm on {host})",
    over_ssh=True, has_scheduler=True, rules=check_rules,
    steps="potato.backends.slurm.steps",
    check="potato.backends.slurm.check:check_slurm",
    leftovers="potato.backends.ssh.leftovers:stop_leftovers",
    unsupported={
        "packages": ("a venv built on the login node may not run on the compute nodes; name the "
                     "compute nodes' interpreter in job_python and load modules in prelude"),
        "gpus": _GRES_NOT_GPUS,
        "min_free_gpu_mb": _GRES_NOT_GPUS,
        "max_gpus": "the scheduler assigns GPUs; ask for several with gres (e.g. gres: gpu:2)",
    },
    keys=(
        keys.TYPE,
        keys.DESCRIPTION,
        Key("host", "str", "the login node: any name `ssh` accepts, `~/.ssh/config` aliases too",
            required=True),
        keys.USER, keys.PORT, keys.IDENTITY_FILE,
        Key("python", "str", "interpreter on the login node, for the agent", default="python3"),
        Key("remote_dir", "str",
            "on storage the compute nodes share; not under `/tmp` or `/var/tmp`", required=True),
        keys.ENV,
        keys.NUM_THREADS,
        keys.MAX_ARTIFACT_MB, keys.FETCH_ARTIFACTS, keys.KEEP_REMOTE, keys.COPY_STALL, keys.HEARTBEAT,
        Key("job_python", "str", "interpreter on the compute nodes, with the trainer's packages",
            required=True),
        Key("prelude", "list of str", "shell lines run in `job.sh` before the worker (`module load …`)",
            default=()),
        Key("partition", "str", "`sbatch --partition`"),
        Key("account", "str", "`sbatch --account`"),
        Key("qos", "str", "`sbatch --qos`"),
        Key("gres", "str", "`sbatch --gres` (e.g. `gpu:1`); a job without it gets no GPU"),
        Key("time", "SLURM time", "`sbatch --time` (e.g. `\"04:00:00\"`); over 6 hours warns"),
        Key("mem", "str", "`sbatch --mem` (e.g. `\"16G\"`)"),
        Key("cpus_per_task", "int", "`sbatch --cpus-per-task`", minimum=1),
        Key("constraint", "str", "`sbatch --constraint`"),
        Key("poll_interval_s", "float", "how often the agent runs `squeue`", default=10, minimum=1),
    ),
    doc="""Compute nodes behind a SLURM login node. `remote_dir` must be on storage the compute nodes
    share. `packages` is not supported: use `job_python` and `prelude`. `gres: gpu:2` gives a
    run two GPUs, and it trains data-parallel on both (one process per GPU, NCCL), as an ssh run
    with several GPUs does.""",
)
