"""The backend types: one line per type.

Adding a type is its declaration (``potato/backend_types/<type>.py``: its
``BackendType``), its folder of steps, check and stop under
``potato/backends/<type>/`` and one line here; nothing else in Potato names
a type. A test registers a type of its own with
``monkeypatch.setitem(BACKEND_TYPES, toy.name, toy)``.

The order is the docs' (docs/backends.md) and the error messages'.
"""

from __future__ import annotations

import importlib
from typing import Any

from potato.backend_types.agent import AGENT
from potato.backend_types.contract import BackendType
from potato.backend_types.local import LOCAL
from potato.backend_types.slurm import SLURM
from potato.backend_types.ssh import SSH

BACKEND_TYPES: dict[str, BackendType] = {t.name: t for t in (
    LOCAL,
    SSH,
    SLURM,
    AGENT,
)}


def backend_type(name: str) -> BackendType:
    """The declaration of type *name*; ``KeyError`` for a type no line above declares."""
    return BACKEND_TYPES[name]


def configurable_types() -> list[str]:
    """The types a config may give a backend it names (``local`` is built in)."""
    return [t.name for t in BACKEND_TYPES.values() if t.configurable]


def resolve(path: str) -> Any:
    """The module (``"module"``) or function (``"module:function"``) a declaration names."""
    module, _, function = path.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, function) if function else loaded
