"""Which trainer trains which schema: the kinds each trainer declares, each kind's default, a run's plan.

A schema's answers have a kind (``potato.training.answer_kinds``); a trainer trains
the kinds it declares. A run names a trainer, or none:

- **none** (the Training page's default, the API without ``trainer``,
  auto-retraining without ``auto_retrain.trainer``): each schema is trained
  by its kind's default trainer (the registry's ``DEFAULT_BY_KIND``), so one run can
  need several trainers — a radio and a span schema train with
  ``hf-text-classification`` and ``hf-span-tagging``, one after the other;
- **one**: it must train every schema of the run, else the run is refused
  (``NoTrainerFor``), naming the schema, its type and the trainers that can.

``plan_trainers`` returns the plan ``{trainer: [schemas]}``, which the run
record keeps and job.json carries (docs/architecture.md, "The job directory").
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from potato.errors import PotatoError
from potato.scheme_fields import untrained_reason
from potato.training.trainers.registry import DEFAULT_BY_KIND, TRAINERS, trainers_for_kind

# Schemes (``potato.config.Scheme``) and configs are duck-typed here: the config checks trainers through
# this module, so importing it back would make a circle.


class NoTrainerFor(PotatoError):
    """Raised when no trainer of a run can train one of its schemas (HTTP 409, CLI exit 2).

    ``schema``, ``annotation_type``, ``trainer`` (the one named, or None) and
    ``able`` (the trainers that can train it) are kept for the callers.
    """

    def __init__(self, scheme: Any, trainer: str | None, able: Sequence[str]):
        self.schema, self.annotation_type, self.trainer, self.able = (
            scheme.name, scheme.annotation_type, trainer, list(able))
        super().__init__(untrainable_message(scheme, trainer, able))


def untrainable_message(scheme: Any, trainer: str | None, able: Sequence[str]) -> str:
    """The one sentence for a schema no trainer of a run can train (runs, API, CLI and validate say it)."""
    what = f"schema {scheme.name!r} ({scheme.annotation_type or 'no annotation_type'})"
    if trainer is not None:
        who = (f"the trainers that can: {', '.join(able)}" if able
               else f"no trainer of this installation trains {scheme.kind} answers")
        return f"Trainer {trainer!r} cannot train {what}; {who}"
    default = DEFAULT_BY_KIND.get(scheme.kind)
    if default is None:
        return f"No trainer can train {what}: {untrained_reason(scheme.annotation_type, scheme.mode)}"
    why = (f"{default}, which this installation does not have" if default not in TRAINERS
           else f"{default}, which does not train them in this installation")
    if able:
        return (f"No default trainer for {what}: {scheme.kind} answers are trained by {why}; name a trainer "
                f"that can: {', '.join(able)}")
    return f"No trainer can train {what}: {scheme.kind} answers are trained by {why}"


def trainer_kinds(trainer: str) -> tuple[str, ...]:
    """The kinds of answer *trainer* is declared to train; ``()`` for one that is not registered."""
    info = TRAINERS.get(trainer)
    return info.kinds if info is not None else ()


def trainers_for(kind: str) -> list[str]:
    """The registered trainers that train answers of *kind*, in registry order."""
    return [info.name for info in trainers_for_kind(kind)]


def default_trainer(kind: str) -> str | None:
    """The trainer a run that names none uses for *kind* (None when it is not registered)."""
    name = DEFAULT_BY_KIND.get(kind)
    return name if name is not None and kind in trainer_kinds(name) else None


def plan_trainers(schemes: Iterable[Any], trainer: str | None = None) -> dict[str, list[str]]:
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


def default_schemas(config: Any, trainer: str | None = None) -> list[str]:
    """The schemas a run that names none trains: ``writeback.schemas``, else every schema a trainer of
    the run can train (*trainer*'s kinds, or those with a default trainer), in config order."""
    if config.model_training.writeback.schemas:
        return list(config.model_training.writeback.schemas)
    kinds = trainer_kinds(trainer) if trainer is not None else None
    return [s.name for s in config.schemes
            if (s.kind in kinds if kinds is not None else default_trainer(s.kind) is not None)]


def project_trainers(config: Any) -> list[str]:
    """The trainers the project's runs use (what a host is checked for): those a run that names neither
    trainer nor schemas would use, then ``auto_retrain.trainer`` and each trainer ``model_training.trainers``
    gives options to, where it can train a schema of the project."""
    try:
        found = list(plan_trainers([config.scheme(s) for s in default_schemas(config)]))
    except NoTrainerFor:
        found = []
    mt = config.model_training
    kinds = {s.kind for s in config.schemes}
    for name in [mt.auto_retrain.trainer, *mt.trainers]:
        if name is not None and name not in found and kinds & set(trainer_kinds(name)):
            found.append(name)
    return found
