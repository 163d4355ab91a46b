"""The ``ssh`` backend type: a host Potato logs in to with OpenSSH (a lab GPU server).

Potato copies its remote half there, starts ``python -m potato.training.agent``
with the run's token on standard input, and the agent talks back through a
socket the run's ssh connection forwards. The steps are in ``steps.py``, the
OpenSSH session in ``openssh.py``, ``potato training check`` in ``check.py``,
stopping what a run left on the host in ``leftovers.py``.
"""

from __future__ import annotations

from potato.backend_types import keys
from potato.backend_types.contract import BackendType
from potato.config_keys import Key

SSH = BackendType(
    name="ssh", article="an", menu="{name} (ssh to {host})",
    over_ssh=True, picks_gpus=True,
    steps="potato.backends.ssh.steps",
    check="potato.backends.ssh.check:check_ssh",
    leftovers="potato.backends.ssh.leftovers:stop_leftovers",
    keys=(
        keys.TYPE,
        keys.DESCRIPTION,
        Key("host", "str", "any name `ssh` accepts, `~/.ssh/config` aliases too", required=True),
        keys.USER, keys.PORT, keys.IDENTITY_FILE,
        Key("python", "str", "the remote interpreter", default="python3"),
        Key("remote_dir", "str", "where Potato keeps its code, envs and job directories on the host",
            default="~/.cache/potato-training"),
        keys.ENV,
        keys.NUM_THREADS,
        Key("gpus", "`gpus` spec", "`auto` (most free memory), `\"1\"`, `\"0,1\"` (pin), `none` (CPU)",
            default="auto"),
        Key("min_free_gpu_mb", "int", "`gpus: auto` refuses to start when no GPU has this much free (or the "
            "GPU memory the run's trainer estimates it needs, when that is more)", default=2000, minimum=0),
        Key("max_gpus", "int", "how many GPUs `gpus: auto` may take, most free memory first, each with "
            "`min_free_gpu_mb` free; a run with several trains data-parallel on all of them", default=1, minimum=1),
        Key("processes", "int", keys.PROCESSES_MEANING, minimum=1, default_text="one per GPU the run has (1 on the CPU)"),
        Key("packages", "list of str",
            "pip requirement strings, installed once into a venv under `remote_dir` (`--system-site-packages`)",
            default=()),
        keys.MAX_ARTIFACT_MB, keys.FETCH_ARTIFACTS, keys.KEEP_REMOTE, keys.COPY_STALL, keys.HEARTBEAT,
    ),
    doc="""A host the server logs in to with an ssh key (a lab GPU server). Several GPUs: a run given
    more than one (`gpus: "0,1"`, or `gpus: auto` with `max_gpus: 2`) trains data-parallel on
    all of them, one process per GPU under torch's launcher (NCCL), and predicts, scores and
    saves as a one-GPU run does; the run log says how many devices trained. On a host without
    GPUs, `processes: N` asks for N CPU processes (gloo).""",
)
