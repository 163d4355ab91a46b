"""The ``local`` backend type: the worker runs as a child process of the annotation server.

Built in: every project has a backend named ``local`` of this type, whose
settings default to ``model_training``'s (an explicit ``backends.local``
entry may override them). Its steps are in ``steps.py``, its check in ``check.py``.
"""

from __future__ import annotations

from potato.backend_types import keys
from potato.backend_types.contract import BackendType
from potato.config_keys import Key

LOCAL = BackendType(
    name="local", article="the", menu="{name} (this machine)",
    on_this_machine=True, configurable=False, inherited=("device", "num_threads", "max_ram_mb"),
    steps="potato.backends.local.steps",
    check="potato.backends.local.check:check",
    leftovers="potato.backends.local.steps:stop_leftovers",
    keys=(
        Key("type", "str", "`local` (the only type the name `local` may have)", default="local"),
        keys.DESCRIPTION,
        Key("device", "device", "`auto` (CUDA, then Apple Metal, then CPU), `cpu`, `cuda`, `cuda:N`, `mps`",
            default_text="`model_training.device` (`auto`)"),
        Key("num_threads", "int", "torch threads and `OMP_NUM_THREADS`", minimum=1,
            default_text="`model_training.num_threads`"),
        Key("max_ram_mb", "int", "the worker stops when its memory passes this", minimum=1,
            default_text="`model_training.max_ram_mb`"),
        Key("processes", "int", keys.PROCESSES_MEANING, minimum=1, default=1),
    ),
    doc="""The built-in backend: a subprocess of the annotation server. A `backends.local` entry may
    set these; otherwise they come from `model_training`. `processes: 2` trains data-parallel in
    two CPU processes (gloo): the several-GPU path, tried without GPUs.""",
)
