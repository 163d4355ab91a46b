"""Trainers registered from a test, not from the package: what a trainer of another kind declares.

``register(monkeypatch, name, kinds, default_for=...)`` adds a trainer that
declares *kinds* to the registry for one test (and makes it its kinds'
default trainer when asked); ``keep_only`` leaves the registry a smaller
installation for one test, so what the parts of the project that choose
trainers by kind (potato/trainer_choice.py) say about a kind no trainer
trains stays tested while the package registers a trainer for every kind.
A toy trains nothing: ``train`` fails the job, naming itself.
"""

from __future__ import annotations

from typing import Any, Sequence

from potato.training.events import TrainerFailure

NAME = "toy"
REQUIRED_MODULES = ()  # type: tuple
DEFAULT_OPTIONS = {}  # type: dict


def check_options(options: Any) -> list:
    return []


def train(job: Any, events: Any) -> None:
    raise TrainerFailure("the toy trainer of tests/support/toy_trainers.py trains nothing")


def register(monkeypatch: Any, name: str, kinds: Sequence[str], *, default_for: Sequence[str] = ()) -> None:
    """Register trainer *name* declaring *kinds* for the current test (undone by *monkeypatch*)."""
    import sys
    import types

    from potato.training.trainers.registry import DEFAULT_BY_KIND, TRAINERS, TrainerInfo

    module_name = f"tests.support.toy_trainers_{name.replace('-', '_')}"
    module = types.ModuleType(module_name)
    module.__dict__.update({key: value for key, value in globals().items() if not key.startswith("__")})
    module.NAME = name
    monkeypatch.setitem(sys.modules, module_name, module)
    monkeypatch.setitem(TRAINERS, name, TrainerInfo(name, module_name, tuple(kinds)))
    for kind in default_for:
        monkeypatch.setitem(DEFAULT_BY_KIND, kind, name)


def keep_only(monkeypatch: Any, kinds_by_trainer: "dict[str, Sequence[str]]") -> None:
    """For the current test, the registry holds only the trainers named, each declaring the kinds given."""
    import dataclasses

    from potato.training.trainers.registry import TRAINERS

    for name in list(TRAINERS):
        if name in kinds_by_trainer:
            monkeypatch.setitem(TRAINERS, name, dataclasses.replace(TRAINERS[name], kinds=tuple(kinds_by_trainer[name])))
        else:
            monkeypatch.delitem(TRAINERS, name)
