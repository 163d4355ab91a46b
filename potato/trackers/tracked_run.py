"""What a run reports to an experiment tracker, gathered on the annotation server from what it already holds.

Nothing here asks the GPU host: the per-step numbers are the worker's own
progress events as the store received them (``loss``, the learning rate
``lr``, ``examples`` per optimizer step, the validation loss and score at
each epoch), the rest is what record results kept beside the run: its
options, its base model, its counts (``training-data.json``), its holdout
scores per schema and per label, its learning curve, and the files a tracker
keeps as artifacts (the scores, the holdout evaluation, the run's report,
a confusion matrix and a reliability diagram per label schema as SVG).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from potato.backends.base import RunContext
from potato.publish.facts import read_training_data
from potato.results import quality_gate
from potato.results.evaluation import read_evaluation
from potato.results.run_report import label_rows, report_markdown
from potato.results.writeback import read_report
from potato.trackers import pictures
from potato.trainer_choice import describe_plan
from potato.training.escaping import json_bytes
from potato.training.trainers import metrics

# What a tracker's metric names may hold (MLflow's rule; TensorBoard takes it too).
_NAME = re.compile(r"[^0-9A-Za-z_\-. /]")


def metric_name(*parts: str) -> str:
    """``sentiment/accuracy``: parts joined by ``/``, each character a tracker refuses made ``_``."""
    return "/".join(_NAME.sub("_", str(p)) for p in parts if p != "")


@dataclass(frozen=True)
class Step:
    """One training progress event: its step, wall time (s) and numbers, named for the tracker."""

    step: int
    t: float
    values: dict[str, float]


@dataclass
class TrackedRun:
    """One run as every tracker reports it."""

    run_id: int
    name: str                # run-7
    project: str
    started_at: float
    params: dict[str, str] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)       # metric name -> value, once per run
    curve: list[tuple[str, int, float]] = field(default_factory=list)  # (metric name, items, value)
    files: dict[str, bytes] = field(default_factory=dict)       # artifact path -> bytes
    model_dir: Path | None = None  # the run's model files, logged only where a tracker's convention asks


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _params(ctx: RunContext, data: dict[str, Any]) -> dict[str, str]:
    run = ctx.run
    options = data.get("options") if isinstance(data.get("options"), dict) else run.options
    params = {"trainer": describe_plan(run.trainers), "backend": run.backend, "schemas": ", ".join(run.schemas),
              "device": run.gpu or "", "base_model": str((options or {}).get("model") or "the trainer's default")}
    for key, value in sorted((options or {}).items()):
        params[f"option/{key}"] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    for key in ("items", "annotators", "aggregation"):
        if data.get(key) is not None:
            params[f"data/{key}"] = str(data[key])
    for key in ("labeled", "holdout"):
        for schema, n in sorted((data.get(key) or {}).items()):
            params[f"data/{schema}/{key}"] = str(n)
    return {metric_name(k): v for k, v in params.items()}


def _steps(ctx: RunContext) -> list[Step]:
    """The training progress events of the whole run (a learning curve's shares left out), one step each."""
    several = len(ctx.run.schemas) > 1
    out, last = [], {}  # last: schema -> (step, t) of its previous event, for examples/s
    for event in ctx.store.events(ctx.run_id):
        data = event.data
        if event.kind != "progress" or data.get("phase") != "train" or data.get("curve") is not None:
            continue
        step, schema = data.get("step"), str(data.get("schema") or "")
        if not isinstance(step, int) or step <= 0:
            continue
        prefix = schema if several else ""
        values = {metric_name(prefix, "train", key): v for key, v in
                  (("loss", _number(data.get("loss"))), ("learning_rate", _number(data.get("lr"))),
                   ("epoch", _number(data.get("epoch"))),
                   ("validation_loss", _number(data.get("validation_loss"))),
                   ("validation_score", _number(data.get("validation_score")))) if v is not None}
        before = last.get(schema)
        examples = data.get("examples")
        if before and isinstance(examples, int) and step > before[0] and event.t > before[1]:
            values[metric_name(prefix, "train", "examples_per_s")] = round(
                (step - before[0]) * examples / (event.t - before[1]), 3)
        last[schema] = (step, event.t)
        if values:
            out.append(Step(step, event.t, values))
    return out


def _scores(scores: dict[str, Any], evaluation: dict[str, Any] | None) -> dict[str, float]:
    out = {}
    for schema, value in sorted(scores.items()):
        for key, number in sorted((value if isinstance(value, dict) else {}).items()):
            if _number(number) is not None:
                out[metric_name("holdout", schema, key)] = float(number)
    for row in label_rows(evaluation):
        for key in ("precision", "recall", "f1"):
            if row[key] is not None:
                out[metric_name("holdout", row["schema"], row["label"], key)] = float(row[key])
    return out


def _curve(scores: dict[str, Any]) -> list[tuple[str, int, float]]:
    out = []
    for schema, value in sorted(scores.items()):
        if not isinstance(value, dict) or not isinstance(value.get("curve"), list):
            continue
        kind = metrics.KINDS.get(value.get("kind") or "nominal")
        for point in value["curve"] if kind else ():
            if isinstance(point, dict) and isinstance(point.get("items"), int) and \
                    _number(point.get(kind.main.key)) is not None:
                out.append((metric_name("learning_curve", schema, kind.main.key), point["items"],
                            float(point[kind.main.key])))
    return out


def _files(ctx: RunContext, scores: dict[str, Any], evaluation: dict[str, Any] | None) -> dict[str, bytes]:
    # A label may hold a lone surrogate: every file is UTF-8 with such a character as its escape.
    files = {"scores.json": json_bytes(scores, indent=1)}
    if evaluation:
        files["evaluation.json"] = json_bytes(evaluation, indent=1)
        for schema, shown in sorted((evaluation.get("schemas") or {}).items()):
            for name, svg in pictures.of_schema(str(schema), shown).items():
                files[f"pictures/{name}"] = svg.encode("utf-8")
    name = ctx.config.annotation_task_name or "project"
    files["report.md"] = report_markdown(ctx.run_id, name, scores, evaluation, quality_gate.read(ctx.paths),
                                         read_report(ctx.config, ctx.run_id)).encode("utf-8")
    return files


def gather(ctx: RunContext) -> TrackedRun:
    """Run *ctx*'s numbers and files, as every tracker reports them."""
    run = ctx.refresh()
    scores = run.scores if isinstance(run.scores, dict) else {}
    evaluation = read_evaluation(ctx.run_dir)
    data = read_training_data(ctx.run_dir) or {}
    return TrackedRun(
        run_id=run.id, name=f"run-{run.id}", project=ctx.config.annotation_task_name or "potato",
        started_at=run.started_at or run.created_at, params=_params(ctx, data), steps=_steps(ctx),
        scores=_scores(scores, evaluation), curve=_curve(scores),
        files=_files(ctx, scores, evaluation),
        model_dir=ctx.paths.artifacts if ctx.paths.artifacts.is_dir() else None)
