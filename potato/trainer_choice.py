"""Which trainer trains which schema: the kinds each trainer declares, each kind's default, a run's plan.

A schema's answers have a kind (``potato.answer_kinds``); a trainer trains
the kinds it declares. A run names a trainer, or none:

- **none** (the Training page's default, the API without ``trainer``,
  auto-retraining without ``auto_retrain.trainer``): each schema is trained
  by its kind's default trainer (``DEFAULT_TRAINER_BY_KIND``), so one run can
  need several trainers — a radio and a span schema train with
  ``hf-text-classification`` and ``hf-span-tagging``, one after the other;
- **one**: it must train every schema of the run, else the run is refused
  (``NoTrainerFor``), naming the schema, its type and the trainers that can.

``plan_trainers`` returns the plan ``{trainer: [schemas]}``, which the run
record keeps and job.json carries (docs/architecture.md, "The job directory").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Iterable, Sequence

from potato.answer_kinds import CONTINUOUS, MULTILABEL, NOMINAL, ORDINAL, SPAN, TEXT
from potato.errors import PotatoError

if TYPE_CHECKING:
    from potato.config import Scheme

DEFAULT_TRAINER_BY_KIND = {
    NOMINAL: "hf-text-classification",
    ORDINAL: "hf-text-classification",
    CONTINUOUS: "hf-text-classification",
    MULTILABEL: "hf-text-classification",
    SPAN: "hf-span-tagging",
    TEXT: "hf-llm-finetune",
}


class NoTrainerFor(PotatoError):
    """Raised when no trainer of a run can train one of its schemas (HTTP 409, CLI exit 2).

    ``schema``, ``annotation_type``, ``trainer`` (the one named, or None) and
    ``able`` (the trainers that can train it) are kept for the callers.
    """

    def __init__(self, scheme: "Scheme", trainer: str | None, able: Sequence[str]):
        self.schema, self.annotation_type, self.trainer, self.able = (
            scheme.name, scheme.annotation_type, trainer, list(able))
        super().__init__(untrainable_message(scheme, trainer, able))


def untrainable_message(scheme: "Scheme", trainer: str | None, able: Sequence[str]) -> str:
    """The one sentence for a schema no trainer of a run can train (runs, API, CLI and validate say it)."""
    from potato.trainers import TRAINERS

    what = f"schema {scheme.name!r} ({scheme.annotation_type or 'no annotation_type'})"
    if trainer is not None:
        who = (f"the trainers that can: {', '.join(able)}" if able
               else f"no trainer of this installation trains {scheme.kind} answers")
        return f"Trainer {trainer!r} cannot train {what}; {who}"
    default = DEFAULT_TRAINER_BY_KIND.get(scheme.kind)
    if default is None:
        return f"No trainer can train {what}: no trainer trains {scheme.kind} answers"
    why = (f"{default}, which this installation does not have" if default not in TRAINERS
           else f"{default}, which does not train them in this installation")
    if able:
        return (f"No default trainer for {what}: {scheme.kind} answers are trained by {why}; name a trainer "
                f"that can: {', '.join(able)}")
    return f"No trainer can train {what}: {scheme.kind} answers are trained by {why}"


def trainer_kinds(trainer: str) -> tuple[str, ...]:
    """The kinds of answer *trainer* declares it trains (its module's ``KINDS``; nominal if it
    declares none); ``()`` for a trainer that is not registered or cannot be imported."""
    from potato.trainers import TRAINERS

    module_name = TRAINERS.get(trainer)
    if module_name is None:
        return ()
    try:
        module = importlib.import_module(module_name)  # stdlib only at import: cheap
    except ImportError:
        return ()
    return tuple(getattr(module, "KINDS", (NOMINAL,)))


def trainers_for(kind: str) -> list[str]:
    """The registered trainers that train answers of *kind*, in registry order."""
    from potato.trainers import TRAINERS

    return [name for name in TRAINERS if kind in trainer_kinds(name)]


def default_trainer(kind: str) -> str | None:
    """The trainer a run that names none uses for *kind* (None when it is not registered)."""
    name = DEFAULT_TRAINER_BY_KIND.get(kind)
    return name if name is not None and kind in trainer_kinds(name) else None


def plan_trainers(schemes: Iterable["Scheme"], trainer: str | None = None) -> dict[str, list[str]]:
    """``{trainer: [schema names]}`` for a run of *schemes*: *trainer* for all, or each kind's default.

    Trainers come in the order their first schema comes. Raises ``NoTrainerFor``
    for the first schema no trainer of the run can train.
    """
    plan: dict[str, list[str]] = {}
    for scheme in schemes:
        chosen = trainer if trainer is not None else default_trainer(scheme.kind)
        if chosen is None or scheme.kind not in trainer_kinds(chosen):
            raise NoTrainerFor(scheme, trainer, trainers_for(scheme.kind))
        plan.setdefault(chosen, []).append(scheme.name)
    return plan


def describe_plan(plan: dict[str, Sequence[str]]) -> str:
    """``hf-text-classification`` for one trainer, else ``hf-text-classification (sentiment, topics) +
    hf-span-tagging (entities)``: how a run's trainers are shown (run log, runs list, pages)."""
    if len(plan) == 1:
        return next(iter(plan))
    return " + ".join(f"{name} ({', '.join(schemas)})" for name, schemas in plan.items())
