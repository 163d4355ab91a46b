"""Runs, events, backends, trainers and schemas as the JSON the page and the admin API send."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from potato.config import ProjectConfig
from potato.protocol.state import display_state
from potato.publish.publication import view as publication_view
from potato.results import quality_gate, stability
from potato.results.promote import predictions_state
from potato.results.retract import why_not as why_not_retractable
from potato.results.writeback import live_run_ids, read_report, report_lines
from potato.runs.paths import run_paths
from potato.runs.store import QUEUED, RUNNING, SUCCEEDED, Event, Run, Store
from potato.text.score_text import curves_json, score_lines
from potato.trainer_choice import default_trainer, describe_plan, trainers_for
from potato.training.trainers.registry import TRAINERS, TrainerInfo, missing_modules, module_names


def duration(run: Run, now: float | None = None) -> float | None:
    if not run.started_at:
        return None
    return max(0.0, (run.finished_at or now or time.time()) - run.started_at)


def ran_on(config: ProjectConfig, run: Run) -> dict[str, Any]:
    backend = config.model_training.backends.get(run.backend)
    return {
        "name": run.backend,
        "type": backend.type if backend else None,
        "description": backend.describe() if backend else f"{run.backend} (no longer in the config)",
    }


def prefect_url(ui_url: str | None, run: Run) -> str | None:
    if not ui_url or not run.prefect_flow_run_id:
        return None
    return f"{ui_url.rstrip('/')}/runs/flow-run/{run.prefect_flow_run_id}"


@dataclass(frozen=True)
class Shown:
    """What annotators see now: the runs whose predictions the writeback file holds, and the pinned runs."""

    live: set[int]
    pins: set[int]

    @classmethod
    def now(cls, config: ProjectConfig) -> "Shown":
        return cls(live_run_ids(config), quality_gate.read_pins(config))


def _gate_json(config: ProjectConfig, run: Run, shown: Shown) -> dict[str, Any]:
    paths = run_paths(config, run.id)
    gate = quality_gate.read(paths) or {}
    state = predictions_state(config, run, shown.live, shown.pins)
    changes = stability.read(config, run.id)
    return {
        "predictions_state": state,
        "gate_text": [v.get("text", "") for v in gate.get("schemas", [])],
        "promoted": gate.get("promoted"),
        "promotable": state == "held back" and run.state == SUCCEEDED,
        "pinned": run.id in shown.pins,
        "changed": stability.cell(changes),
        "changed_text": [c.describe() for c in changes],
    }


def run_json(config: ProjectConfig, store: Store, run: Run, *, claimed: bool = False,
             ui_url: str | None = None, now: float | None = None, shown: Shown | None = None) -> dict[str, Any]:
    state = display_state(config, run, claimed)
    return {
        "id": run.id,
        "trainer": run.trainer,
        "trainers": run.trainers,  # {trainer: [schemas]}: every trainer of the run and what it trains
        "trainers_text": describe_plan(run.trainers),
        "schemas": list(run.schemas),
        "trigger": run.trigger,
        "backend": run.backend,
        "ran_on": ran_on(config, run),
        "state": state,
        "stored_state": run.state,
        "active": run.state == RUNNING,
        "step": run.step,
        "progress": run.progress,
        "progress_text": run.progress_text,
        "queue_position": store.queue_position(run.id) if run.state == QUEUED else None,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "duration_s": duration(run, now),
        "cancel_requested": run.cancel_requested_at is not None,
        "cancel_requested_at": run.cancel_requested_at,
        "error": run.error,
        "scores": run.scores or {},
        "scores_text": score_lines(run.scores),
        "curves": curves_json(run.scores),
        "options": run.options or {},
        "artifact_uri": run.artifact_uri,
        "host_python": run.host_python,
        "gpu": run.gpu,
        "prefect_flow_run_id": run.prefect_flow_run_id,
        "prefect_url": prefect_url(ui_url, run),
        "publication": publication_view(run.publication),
        "retracted_at": run.retracted_at,
        "retractable": run.retracted_at is None and why_not_retractable(
            run, written_back=run.state != SUCCEEDED and run_paths(config, run.id).written_back.exists()) is None,
        **_gate_json(config, run, shown or Shown.now(config)),
    }


def writeback_json(config: ProjectConfig, store: Store) -> dict[str, Any]:
    """What annotators see of the newest run whose predictions are written back (not retracted): its
    writeback report in words and the least certain items nobody labelled; before it, what the quality
    gate held back of newer runs (``held_back``: one sentence per schema)."""
    held: list[str] = []
    settled: list[str] | None = None  # the stopping signal of the newest run
    for run in store.list_runs():
        if run.state != SUCCEEDED or run.retracted_at is not None:
            continue
        if settled is None:
            settled = [change.describe() for change in stability.read(config, run.id)]
        report = read_report(config, run.id)
        if report is not None:  # its own held-back schemas are among its report's lines
            return {"available": True, "run_id": run.id, "written_at": report.get("written_at"),
                    "lines": report_lines(report), "least_certain": report.get("least_certain", []),
                    "held_back": held, "changed": settled}
        held.extend(f"Run {run.id} was not written back: {v['text']}"
                    for v in quality_gate.held_back(run_paths(config, run.id)))
    return {"available": False, "held_back": held, "changed": settled or []}


def event_json(event: Event) -> dict[str, Any]:
    return {"seq": event.seq, "t": event.t, "kind": event.kind, "data": event.data}


def backends_json(config: ProjectConfig) -> list[dict[str, Any]]:
    """The Runs on menu: every backend in config order, ``local`` last; the default is marked."""
    default = config.model_training.backend or "local"
    names = sorted(config.model_training.backends, key=lambda n: n == "local")  # stable
    result = []
    for name in names:
        backend = config.model_training.backends[name]
        result.append({
            "name": name,
            "type": backend.type,
            "host": backend.host,
            "description": backend.describe(),
            "default": name == default,
        })
    return result


def trainer_json(info: TrainerInfo) -> dict[str, Any]:
    """One trainer as Potato 2.12.1's ``/api/trainers`` lists it (its ``TrainerInfo.to_dict`` and availability),
    plus what runs need to know here: local-only, device, packages."""
    missing = missing_modules(info)
    return {
        "name": info.name,
        "description": info.description,
        "kinds": list(info.kinds),
        "modalities": ["text"],
        "install_hint": info.install_hint,
        "available": not missing,
        "unavailable_reason": (f"This server lacks {module_names(missing)}, which local runs of it need: "
                               f"{info.install_hint}") if missing else "",
        "local_only": bool(info.local_only),
        "uses_device": info.uses_device,
        "required_modules": list(info.required_modules),
    }


def trainers_json() -> list[dict[str, Any]]:
    return [trainer_json(info) for info in TRAINERS.values()]


def schemas_json(config: ProjectConfig) -> list[dict[str, Any]]:
    """Each schema with the trainers that can train it, as Potato 2.12.1's ``/api/schemas`` answers."""
    rows = []
    for scheme in config.schemes:
        names = trainers_for(scheme.kind)
        rows.append({"name": scheme.name, "annotation_type": scheme.annotation_type, "kind": scheme.kind,
                     "trainers": names, "trainable": bool(names), "default_trainer": default_trainer(scheme.kind)})
    return rows
