"""What a model card says about a run, gathered from the run's record and directory — counts only.

``training-data.json`` (``RunPaths.training_data``) is written into the run's directory at
build-bundle, beside the bundle that clean-up deletes: the counts the card
needs and the bundle alone knew (items, annotators, labels per class, ties,
aggregation, the split) and the trainer's options as the worker got them.
It holds numbers and the names of schemas and labels; never an item, an id
or an annotator's name. A run from before it existed still gets a card: its
labelled and held-out counts come from ``labels.jsonl`` (``potato.results.evaluation``).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

from potato.config import ProjectConfig
from potato.publish.card import CardFacts, SchemaFacts
from potato.results.evaluation import read_evaluation
from potato.runs.paths import RunPaths
from potato.runs.store import Run
from potato.training import atomic_files

FORMAT = 1
AGGREGATIONS = {"majority": "majority vote (a tie goes to the label listed first)",
                "consensus": "Dawid-Skene consensus (annotators weighted by their estimated reliability)"}


def record_training_data(run_dir: Path, manifest: Mapping[str, Any], annotators: int,
                         options: Mapping[str, Any]) -> None:
    """Write ``training-data.json`` from the bundle's *manifest*, its annotator count and the trainer's *options*."""
    counts = manifest.get("counts", {})
    data = {
        "format": FORMAT,
        "items": counts.get("items"),
        "annotators": annotators,
        "labeled": counts.get("labeled", {}),
        "holdout": counts.get("holdout", {}),
        "ties": counts.get("ties", {}),
        "labels": counts.get("labels", {}),
        "aggregation": manifest.get("aggregation"),
        "split": {k: manifest[k] for k in ("holdout_fraction", "splits", "split_seed") if k in manifest},
        "options": dict(options),
    }
    atomic_files.write_text(RunPaths(run_dir).training_data, json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def read_training_data(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(RunPaths(run_dir).training_data.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def describe_split(split: Mapping[str, Any] | None) -> str | None:
    if not split:
        return None
    if "holdout_fraction" in split:
        return (f"{split['holdout_fraction']:.0%} of the labelled items, chosen by a hash of each item's id "
                f"(the same items on every run)")
    tests = (split.get("splits") or {}).get("test")
    share = f"{tests:.0%} " if isinstance(tests, (int, float)) else ""
    return f"the {share}test split of Potato's seeded split (split_seed {split.get('split_seed', 0)})"


def _counts_from_labels(run_dir: Path, schemas: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per schema: labelled, held out and per-label counts from ``labels.jsonl`` (runs without training-data.json)."""
    found = {s: {"labelled": 0, "held_out": 0, "per_label": Counter()} for s in schemas}
    try:
        with open(RunPaths(run_dir).labels, "rb") as fh:
            for line in fh:
                record = json.loads(line)
                entry = found.get(record.get("schema"))
                if entry is not None:
                    entry["labelled"] += 1
                    entry["held_out"] += bool(record.get("holdout"))
                    entry["per_label"][str(record.get("gold"))] += 1
    except (OSError, ValueError):
        return {}
    return found


def effective_options(config: ProjectConfig, run: Run, run_dir: Path) -> dict[str, Any]:
    """The trainer's options as the worker got them (training-data.json, else as the config gives them now),
    over the trainer's defaults."""
    from potato.training.trainers.registry import TRAINERS, load

    data = read_training_data(run_dir)
    if data is not None and isinstance(data.get("options"), dict):
        given = data["options"]
    else:
        from potato.runs.jobs import make_job

        given = make_job(config, run, bundle="")["options"]
    info = TRAINERS.get(run.trainer)  # a run of several trainers: each has its own defaults, none shown here
    defaults = getattr(load(info), "DEFAULT_OPTIONS", {}) if info else {}
    return {**defaults, **given}


class SchemaModel(NamedTuple):
    """One schema's model as its ``labels.json`` describes it."""

    name: str
    labels: Sequence[str]
    folder: str                         # in the repo; "" at its root
    trainer: str | None = None
    head: Sequence[str] | None = None   # the model's outputs when they are not the labels (a span tagger's tags)
    vectorizer: str | None = None       # sklearn-text's sentence-transformers model, when it has one
    mean_pooled: bool = False           # a classifier on the mean of the token states (potato.training.trainers.pooling)


def card_facts(config: ProjectConfig, run: Run, run_dir: Path, schemas: Sequence[SchemaModel], *,
               kind: str, base_model: str | None, base_model_note: str | None, license: str | None,
               options: Mapping[str, Any], calibration: tuple[int, Mapping[str, Any]] | None = None) -> CardFacts:
    """The card's facts for *run*'s model, one ``SchemaModel`` per schema;
    *calibration* ``(decision-calibrate run id, its scores)`` when that run is published with it."""
    data = read_training_data(run_dir) or {}
    fallback = {} if data else _counts_from_labels(run_dir, [s.name for s in schemas])
    evaluation = (read_evaluation(run_dir) or {}).get("schemas", {})
    later = None
    facts = []
    for name, labels, folder, trainer, head, vectorizer, mean_pooled in schemas:
        shown = evaluation.get(name, {})
        if shown.get("calibration", {}).get("by_run") is not None:
            later = shown["calibration"]["by_run"]
        counted = fallback.get(name, {})
        per_label = data.get("labels", {}).get(name) or dict(counted.get("per_label", {})) or None
        facts.append(SchemaFacts(
            name=name, labels=list(labels), folder=folder, scores=run.scores.get(name, {}),
            confusion=shown.get("confusion") if shown.get("labels") == list(labels) else None,
            labelled=data.get("labeled", {}).get(name, counted.get("labelled")),
            held_out=data.get("holdout", {}).get(name, counted.get("held_out")),
            per_label=per_label, ties=data.get("ties", {}).get(name),
            calibration=calibration[1].get(name) if calibration else None, trainer=trainer, head=head,
            vectorizer=vectorizer, mean_pooled=mean_pooled,
        ))
    backend = config.model_training.backends.get(run.backend)
    started, finished = run.started_at, run.finished_at
    return CardFacts(
        project=config.annotation_task_name, run_id=run.id, trainer=run.trainer, kind=kind,
        base_model=base_model, base_model_note=base_model_note, license=license, options=options,
        schemas=facts, items=data.get("items"), annotators=data.get("annotators"),
        aggregation=AGGREGATIONS.get(data.get("aggregation"), data.get("aggregation")),
        split=describe_split(data.get("split")), backend_type=backend.type if backend else None,
        device=run.gpu, duration_s=(finished - started) if started and finished else None,
        finished_at=finished, calibrated_by=calibration[0] if calibration else None,
        calibrated_later_by=None if calibration else later,
    )
