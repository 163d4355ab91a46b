"""Writeback (SPEC §10): the newest run's predictions, where a Potato server can show them.

The file is ``<output_annotation_dir>/training/predictions.jsonl``, one line per
item and schema::

    {"id": "r1", "schema": "sentiment", "label": "positive", "confidence": 0.93, "run_id": 7}

Only ``writeback.schemas`` are written, only predictions at or above
``writeback.min_confidence``. For each schema a run writes, its lines replace
those of earlier runs (newest run wins); other schemas' lines stay. The file
is replaced atomically, so a reader never sees half of it. Annotators'
``user_state.json`` files are never opened for writing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from potato.config import ProjectConfig


@dataclass
class WritebackSummary:
    path: Path
    written: dict[str, int] = field(default_factory=dict)
    below_confidence: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        if not self.written and not self.below_confidence:
            return "Writeback: no schema of this run is listed in model_training.writeback.schemas"
        parts = [
            f"{schema}: {count} predictions ({self.below_confidence.get(schema, 0)} below min_confidence)"
            for schema, count in self.written.items()
        ]
        return f"Wrote back to {self.path}: " + "; ".join(parts)


def writeback_path(config: ProjectConfig) -> Path:
    return config.training_dir / "predictions.jsonl"


def read_predictions(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def write_back(config: ProjectConfig, run_id: int, predictions: Path) -> WritebackSummary:
    """Merge *predictions* of run *run_id* into the project's writeback file."""
    wb = config.model_training.writeback
    target = writeback_path(config)
    summary = WritebackSummary(path=target)
    wanted = set(wb.schemas)
    if not wanted or not predictions.exists():
        return summary
    run_schemas: set[str] = set()
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as out:
        for pred in read_predictions(predictions):
            schema = pred.get("schema")
            if schema not in wanted:
                continue
            run_schemas.add(schema)
            if float(pred.get("confidence", 0.0)) < wb.min_confidence:
                summary.below_confidence[schema] = summary.below_confidence.get(schema, 0) + 1
                continue
            summary.written[schema] = summary.written.get(schema, 0) + 1
            line = {k: pred[k] for k in ("id", "schema", "label", "confidence") if k in pred}
            line["run_id"] = run_id
            out.write(json.dumps(line) + "\n")
        if target.exists():
            for old in read_predictions(target):
                if old.get("schema") not in run_schemas:
                    out.write(json.dumps(old) + "\n")
        out.flush()
        os.fsync(out.fileno())
    for schema in run_schemas:
        summary.written.setdefault(schema, 0)
    os.replace(tmp, target)
    return summary
