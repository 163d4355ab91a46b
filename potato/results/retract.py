"""Retract a run's predictions: annotators no longer see them, and the newest earlier run's come back, per schema.

The undo for a model that turned out bad, as Potato 2.12.1's own
``DELETE /admin/training/api/runs/<id>/predictions`` is for its runs: the
command (``potato training retract``), the run page's button and the same
route of this project's admin API all come here.

For each schema whose predictions in the writeback file are the run's, they
are taken out and replaced by what the newest earlier run that is not
retracted wrote back for that schema (its ``written-back.jsonl``,
``potato.results.writeback``): what annotators saw before the run. A schema no earlier
run wrote back is left with none. Other schemas are untouched. When the
writeback is live (``potato.results.live_writeback``) the items' records follow at
once, and a running Potato 2.12 shows the change within one poll; otherwise
at its next restart.

Any run whose predictions the writeback file holds can be retracted,
whatever its state: a run that failed after its predictions were written
back (and went live) must not leave them with annotators. The run is marked
retracted in the store first, so a retract cut short (a crash) is finished
by running it again, and no later retract or decision-calibrate run brings
its predictions back. A run whose predictions a newer run had already
replaced is marked too: nothing annotators see changes. A decision-calibrate
run's calibration lives in the predictions of the run it calibrated:
retract that run.

A retract whose live writeback could not bring every record along (a file
left as it was: a full disk, a lock a feed kept; or the live writeback
refused after an earlier one) fails, naming those files: their records may
still show the run's predictions. Fix that and retract again; the second
retract finishes the records.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Iterator

from potato.config import ProjectConfig, watch_poll_interval
from potato.errors import RetractError
from potato.prefill.review_order import strip_order
from potato.results.live_writeback import LiveReport, is_live, sync_reported
from potato.results.writeback import record_line, replacing, run_record, writeback_lock, writeback_path
from potato.runs.paths import run_paths
from potato.runs.runlog import RunLog
from potato.runs.store import SUCCEEDED, Run, Store
from potato.training.trainers.decision_calibrate import NAME as CALIBRATE


@dataclass
class RetractResult:
    """What a retract changed: per schema, the run whose predictions annotators see now (None: none)."""

    run_id: int
    restored: dict[str, int | None]
    already: bool = False
    live: LiveReport | None = None
    poll_s: float | None = None  # Potato 2.12's watch_poll_interval, when live

    def describe(self) -> str:
        """What the command, the page and the run log say."""
        if self.behind:
            return self.behind_message()
        if not self.restored:
            if self.already:
                if self.live is not None and self.live.files:
                    return (f"Run {self.run_id}'s predictions were already retracted from the writeback file; the "
                            f"items' records that still held them no longer do, within {self.poll_s:g} s "
                            "(watch_poll_interval)")
                return f"Run {self.run_id}'s predictions were already retracted; nothing changed"
            return (f"Run {self.run_id}'s predictions were retracted; annotators saw none of them (a newer run's "
                    "replaced them), so nothing they see changes")
        shown = [f"run {source}'s predictions of {schema}" if source is not None else f"no predictions of {schema}"
                 for schema, source in self.restored.items()]
        text = f"Run {self.run_id}'s predictions were retracted: annotators now see " + _and(shown)
        if self.live is None:
            return text + " once Potato 2.12 restarts (it reads pre_annotation.predictions_file at its start)"
        if self.live.error:
            return text + f" once Potato 2.12 restarts; the items' records were not changed: {self.live.error}"
        return text + f", within {self.poll_s:g} s (watch_poll_interval)"

    @property
    def behind(self) -> list[str]:
        """The files whose records may still hold the run's predictions (left as they were)."""
        return self.live.behind if self.live is not None else []

    def behind_message(self) -> str:
        why = self.live.error if self.live.error else "; ".join(self.live.problems)
        return (f"Run {self.run_id}'s predictions were retracted from the writeback file, but the records of "
                f"{_and(self.behind)} may still hold them, where annotators see them: {why}. Fix that, then "
                f"retract run {self.run_id} again")

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "restored": self.restored, "already_retracted": self.already,
                "message": self.describe(), "live": self.live.as_dict() if self.live is not None else None}


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def why_not(run: Run, written_back: bool = False) -> str | None:
    """Why *run* has no predictions to retract, or None. *written_back*: some of its predictions were written
    back (the writeback file holds them), whatever the run's state."""
    if run.trainer == CALIBRATE:
        return ("it is a decision-calibrate run, whose calibration is in the predictions of the run it "
                "calibrated: retract that run")
    if run.state != SUCCEEDED and not written_back:
        return f"it {run.state}" if run.state in ("failed", "cancelled") else f"it is {run.state}"
    return None


def retract(config: ProjectConfig, store: Store, run_id: int) -> RetractResult:
    """Take run *run_id*'s predictions away from annotators (module docstring).

    Raises ``UnknownRun``, or ``RetractError`` naming why the run has none to retract, or naming the files
    whose records may still hold them.
    """
    run = store.get_run(run_id)
    if run.trainer == CALIBRATE:
        raise RetractError(f"Run {run_id} has no predictions to retract: {why_not(run)}")
    field_name = config.model_training.writeback.field
    with writeback_lock(config):
        already = run.retracted_at is not None
        records = list(_records(config))
        schemas = sorted({schema for record in records for schema in record[field_name]
                          if _run_of(record, field_name, schema) == run_id})
        why = None if already else why_not(run, written_back=bool(schemas))
        if why:
            raise RetractError(f"Run {run_id} has no predictions to retract: {why}")
        if not already:
            store.update_run(run_id, retracted_at=time.time())
        result = RetractResult(run_id, {}, already=already and not schemas)
        if schemas:
            sources = _earlier(config, store, run_id, schemas)
            result.restored = {schema: sources[schema][0] if schema in sources else None for schema in schemas}
            _rewrite(config, records, run_id, schemas, sources)
        if is_live(config) and (schemas or already):  # again: the records a retract cut short left behind
            result.poll_s = watch_poll_interval(config.raw)
            result.live = sync_reported(config)
    log = RunLog(store, run_id, run_paths(config, run_id).run_log, mirror_to_prefect=False)
    if result.behind:
        log.warning(result.describe())
        raise RetractError(result.describe())
    if not result.already or (result.live is not None and result.live.files):
        log.info(result.describe())
    return result


def _records(config: ProjectConfig) -> Iterator[dict[str, Any]]:
    field_name = config.model_training.writeback.field
    try:
        handle = open(writeback_path(config), encoding="utf-8")
    except FileNotFoundError:
        return
    with handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            if isinstance(record, dict) and isinstance(record.get(field_name), dict):
                yield record


def _run_of(record: dict[str, Any], field_name: str, schema: str) -> Any:
    """The run whose prediction of *schema* the record holds (in the prediction, or the record's ``run_ids``)."""
    found = (record.get("run_ids") or {}).get(schema)
    if found is None:
        prediction = record[field_name][schema]
        found = prediction.get("run_id") if isinstance(prediction, dict) else None
    return found


def _earlier(config: ProjectConfig, store: Store, run_id: int, schemas: list[str]) -> dict[str, tuple[int, list]]:
    """Per schema, the newest earlier run (succeeded, not retracted) with a record of what it wrote back
    for it, and those lines of its record."""
    found: dict[str, tuple[int, list]] = {}
    for run in store.list_runs():
        if len(found) == len(schemas):
            break
        if run.id >= run_id or run.retracted_at is not None or why_not(run):
            continue
        wanted = set(schemas) - set(found)
        lines: dict[str, list] = {}
        for line in run_record(run_paths(config, run.id).written_back):
            if line.get("schema") in wanted:
                lines.setdefault(line["schema"], []).append(line)
        for schema, kept in lines.items():
            found[schema] = (run.id, kept)
    return found


def _rewrite(config: ProjectConfig, records: list[dict[str, Any]], run_id: int, schemas: list[str],
             sources: dict[str, tuple[int, list]]) -> None:
    """The writeback file without run *run_id*'s predictions of *schemas*, with *sources*' in their place."""
    field_name = config.model_training.writeback.field
    by_id: dict[str, dict[str, Any]] = {}
    for record in records:
        for schema in schemas:
            if schema in record[field_name] and _run_of(record, field_name, schema) == run_id:
                del record[field_name][schema]
                (record.get("run_ids") or {}).pop(schema, None)
        by_id[record["id"]] = record
    for schema, (source, lines) in sources.items():
        for line in lines:
            record = by_id.setdefault(line["id"], {"id": line["id"], field_name: {}})
            if schema in record[field_name]:
                continue
            prefill = line["prefill"]
            record[field_name][schema] = prefill
            if not (isinstance(prefill, dict) and "run_id" in prefill):
                record.setdefault("run_ids", {})[schema] = source
    for record in by_id.values():  # the places of the newest writeback's order go too (potato.prefill.review_order)
        record[field_name] = {schema: shown for schema, payload in record[field_name].items()
                              if (shown := strip_order(payload)) is not None}
    with replacing(writeback_path(config)) as out:
        for record in by_id.values():
            if record[field_name]:
                out.write(record_line(record["id"], field_name, record[field_name], record.get("run_ids") or {}))
