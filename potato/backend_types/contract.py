"""What a backend type is: ``BackendType``, one object per type, and what its check and stop give back.

A backend type declares everything the rest of Potato needs to know about
it, so that nothing else asks for a type by name: the keys of its config
entry, how the Runs on menu shows a backend of it, extra rules for its
entry, what it can do (the capability flags below), and where its code
is — the module of its flow steps (``potato.backends.base.Steps``), its
``potato training check`` and how what a run left running is stopped —
named as ``"module"`` / ``"module:function"``, so that reading the config
imports none of it. ``potato.backend_types.type_registry`` holds one line per type.

Pure: the declarations import only ``potato.config_keys``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from potato.config_keys import Issues, Key


@dataclass(frozen=True)
class BackendType:
    """One type of backend, declared (module docstring)."""

    name: str                          # the value of a backend's `type:`
    keys: tuple[Key, ...]              # its entry's keys (docs/backends.md shows them)
    menu: str                          # the Runs on menu's text, with {name} and {host}
    steps: str                         # the module of its flow steps
    check: str                         # "module:function": (config, backend) -> CheckReport
    leftovers: str | None = None       # "module:function": (config, store, run) -> Stopped
    article: str = "a"                 # as in "an ssh backend"
    doc: str = ""                      # its section of docs/backends.md
    configurable: bool = True          # a config may give a backend this type (local is built in)
    inherited: tuple[str, ...] = ("heartbeat_timeout_s",)  # keys whose default is model_training's own
    unsupported: Mapping[str, str] = field(default_factory=dict)  # key of another type -> why not here, the fix
    rules: Callable[[Mapping[str, Any], str, Issues], None] | None = None  # checks beyond one key's type
    # What it can do; the code that differs by backend reads these, never the type's name.
    on_this_machine: bool = False      # its worker runs on the annotation server's machine
    over_ssh: bool = False             # Potato logs in to its host with OpenSSH and forwards a socket there
    picks_gpus: bool = False           # Potato chooses the run's GPUs from the host's nvidia-smi
    has_scheduler: bool = False        # a scheduler runs the worker, on the GPUs it gives the job
    claimed_by_agent: bool = False     # an agent this server cannot reach claims its runs (a backend token)

    @property
    def what(self) -> str:
        """``an ssh backend``: the type with its article, for messages."""
        return f"{self.article} {self.name} backend"

    def describe(self, name: str, host: str | None) -> str:
        """The Runs on menu's text for backend *name* of this type."""
        return self.menu.format(name=name, host=host)

    def defaults(self) -> dict[str, Any]:
        """Every key (``type`` excepted) with its default."""
        return {k.name: k.default for k in self.keys if k.name != "type"}


@dataclass
class CheckReport:
    """What ``potato training check`` found: could a run start on the backend, and where would it run."""

    backend: str
    type: str
    ok: bool
    lines: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "type": self.type, "ok": self.ok, "report": self.lines, **self.data}

    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass(frozen=True)
class Stopped:
    """Whether everything a run started is known to be gone, and what was done (or why it is not known)."""

    verified: bool
    said: str = ""
