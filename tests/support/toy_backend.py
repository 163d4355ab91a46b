"""A toy backend type and a toy trainer, each declared here and registered by a test, not by the package.

They prove that adding a type or a trainer is its own module plus one
registry line: ``monkeypatch.setitem(BACKEND_TYPES, TOY.name, TOY)`` and
``monkeypatch.setitem(TRAINERS, TOY_TRAINER.name, TOY_TRAINER)``. The toy
backend "runs" nothing: its steps say what they would do, and its worker
has exited 0 before anyone polls it.
"""

from __future__ import annotations

from typing import Any

from potato.backend_types import keys
from potato.backend_types.contract import BackendType, CheckReport
from potato.config_keys import Key
from potato.training.trainers.options import check_keys, is_int
from potato.training.trainers.registry import TrainerInfo

TOY = BackendType(
    name="toy",
    keys=(keys.TYPE, keys.DESCRIPTION, Key("host", "str", "where the toy lives", required=True),
          Key("flavour", "str", "what the toy tastes of", default="vanilla"), keys.HEARTBEAT),
    menu="{name} (toy at {host})",
    steps="tests.support.toy_backend",
    check="tests.support.toy_backend:check",
    doc="A backend type that runs nothing, declared by a test.",
)


def check(config: Any, backend: Any) -> CheckReport:
    return CheckReport(backend=backend.name, type=backend.type, ok=True,
                       lines=[f"{backend.name}: a toy at {backend.host}, {backend.get('flavour')}"])


def connect(ctx: Any) -> str:
    return "toy session"


def pick_gpu(ctx: Any, session: Any) -> str:
    return "no GPU: a toy"


def sync_code(ctx: Any, session: Any) -> str:
    return "nothing to copy"


def spawn(ctx: Any, session: Any) -> str:
    return "toy worker"


def poll(ctx: Any, session: Any, handle: Any) -> int | None:
    return 0


def stop(ctx: Any, session: Any, handle: Any, grace: float) -> None:
    pass


def fetch_artifacts(ctx: Any, session: Any, handle: Any) -> None:
    pass


def clean_up(ctx: Any, session: Any | None, handle: Any | None) -> None:
    pass


# -- the toy trainer: this module is its module too ----------------------------

NAME = "toy-trainer"
DEFAULT_OPTIONS = {"rounds": 1}
REQUIRED_MODULES = ()
USES_DEVICE = False

TOY_TRAINER = TrainerInfo(NAME, __name__, ("ordinal",), "Counts to rounds, declared by a test",
                          uses_device=False)


def check_options(options: Any) -> list[str]:
    options, problems = check_keys(options, DEFAULT_OPTIONS, NAME)
    if "rounds" in options and not (is_int(options["rounds"]) and options["rounds"] > 0):
        problems.append(f"rounds must be a positive integer, got {options['rounds']!r}")
    return problems


def train(job: Any, events: Any) -> None:
    events.log(f"{NAME}: nothing to learn")
