"""The stopping signal: how many unlabelled items' predicted labels changed since the previous run.

When a model's predictions on the items nobody labelled stop changing from
one run to the next, more labels of the same kind are unlikely to change the
model much (the stabilising-predictions criterion, Bloodgood and
Vijay-Shanker, CoNLL 2009). At record results, for each label schema of the
run (a radio, a scale, a multi-label set), this run's predicted labels of
the items no annotator labelled are compared with those of the previous run
that trained the schema and kept its predictions; below
``model_training.stable_below`` (1 %) changed, the predictions have settled.
Kept in ``runs/<id>/stability.json``; the run log, ``potato training runs``
(CHANGED) and the Training page show it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from potato.config import ProjectConfig
from potato.items.json_lines import load_line, read_lines
from potato.prefill.prediction_shapes import schema_records
from potato.runs.paths import run_paths
from potato.runs.store import SUCCEEDED, Store
from potato.training import atomic_files
from potato.training.answer_kinds import MULTILABEL, NOMINAL, ORDINAL
from potato.training.escaping import json_bytes

LABEL_KINDS = (NOMINAL, ORDINAL, MULTILABEL)


@dataclass
class Change:
    """One schema's change since the previous run: *changed* of *compared* unlabelled items."""

    schema: str
    previous_run: int
    compared: int
    changed: int
    stable_below: float

    @property
    def share(self) -> float:
        return self.changed / self.compared if self.compared else 0.0

    @property
    def stable(self) -> bool:
        return self.compared > 0 and self.share < self.stable_below

    def describe(self) -> str:
        text = (f"{self.schema}: {self.changed} of {self.compared} unlabelled items' predicted labels changed since "
                f"run {self.previous_run} ({100 * self.share:.1f} %)")
        if self.stable:
            return (text + f", below model_training.stable_below ({100 * self.stable_below:g} %): the predictions "
                    "have settled; more labels like these may change the model little")
        return text + f"; settled below {100 * self.stable_below:g} % (model_training.stable_below)"

    def short(self) -> str:
        """``0.4 % (stable)``: the Runs tables' cell."""
        return f"{100 * self.share:.1f} %" + (" (stable)" if self.stable else "")


def _labels(predictions: Path, schema: str, skip: set[str]) -> dict[str, Any]:
    """Item id -> predicted label (a set: sorted) of *schema* in a predictions file, items in *skip* left out."""
    found: dict[str, Any] = {}
    for record in schema_records(predictions, schema):
        item, label = record.get("id"), record.get("label")
        if isinstance(item, str) and item not in skip and label is not None:
            found.setdefault(item, tuple(sorted(map(str, label))) if isinstance(label, list) else label)
    return found


def _labelled(labels_file: Path) -> dict[str, set[str]]:
    """Schema -> the ids labelled in the run's bundle (its ``labels.jsonl``)."""
    found: dict[str, set[str]] = {}
    for line in read_lines(labels_file):
        found.setdefault(line["schema"], set()).add(line["id"])
    return found


def measure(config: ProjectConfig, store: Store, run_id: int, kinds: dict[str, str]) -> list[Change]:
    """Each label schema's change since the previous run that trained it (none for a schema's first run)."""
    schemas = [s for s, kind in kinds.items() if kind in LABEL_KINDS]
    paths = run_paths(config, run_id)
    labelled = _labelled(paths.labels)
    earlier = [r for r in store.list_runs() if r.id < run_id and r.state == SUCCEEDED and r.retracted_at is None]
    changes = []
    for schema in schemas:
        previous = next((r for r in earlier if schema in r.schemas
                         and run_paths(config, r.id).predictions.is_file()), None)
        if previous is None:
            continue
        skip = labelled.get(schema, set())
        ours = _labels(paths.predictions, schema, skip)
        theirs = _labels(run_paths(config, previous.id).predictions, schema, skip)
        shared = ours.keys() & theirs.keys()
        if shared:
            changes.append(Change(schema, previous.id, len(shared), sum(ours[i] != theirs[i] for i in shared),
                                  config.model_training.stable_below))
    return changes


def save(config: ProjectConfig, run_id: int, changes: Iterable[Change]) -> None:
    atomic_files.write_bytes(run_paths(config, run_id).stability,
                             json_bytes({"schemas": [asdict(c) for c in changes]}, indent=2))


def read(config: ProjectConfig, run_id: int) -> list[Change]:
    """The changes kept for run *run_id* (none: its first run of every schema, or it came before this)."""
    try:
        data = load_line(run_paths(config, run_id).stability.read_bytes())
        return [Change(**entry) for entry in data.get("schemas", [])]
    except (OSError, ValueError, TypeError, AttributeError):
        return []


def cell(changes: list[Change]) -> str:
    """The Runs tables' CHANGED cell: ``0.4 % (stable)``; per schema when the run trained several; ``-``."""
    if not changes:
        return "-"
    if len(changes) == 1:
        return changes[0].short()
    return ", ".join(f"{c.schema} {c.short()}" for c in changes)
