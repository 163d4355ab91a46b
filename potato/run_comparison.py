"""Runs side by side: their options, data, scores per schema and per label, learning curves and confusion matrices.

``potato training compare config.yaml 7 9`` prints it, the admin API's
``compare`` route sends it as JSON and the compare page
(``/admin/training/compare?runs=7,9``) shows it; all three read this. Each
row is one fact of every run, as text, and says whether the runs differ in
it, so that a reader sees at a glance what changed between two model
versions and what it did to the scores. What a run no longer has (its
directory pruned by ``retain_runs``, a run from before the holdout
evaluation) shows as ``-``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from potato.config import ProjectConfig
from potato.errors import CompareError
from potato.follow import format_duration, run_duration
from potato.publish.facts import read_training_data
from potato.results.evaluation import read_evaluation
from potato.results.run_report import label_rows
from potato.runs.paths import run_paths
from potato.runs.store import MAX_RUN_ID, Run, Store
from potato.text.score_text import curve_line, number_text
from potato.trainer_choice import describe_plan

MISSING = "-"
# Side by side stays readable, and a request's work bounded (each run's files are read).
MAX_RUNS = 8
SECTIONS = ("Run", "Options", "Data", "Holdout scores", "Per label", "Learning curve")


@dataclass(frozen=True)
class Row:
    section: str
    name: str
    values: tuple[str, ...]

    @property
    def differs(self) -> bool:
        return len(set(self.values)) > 1


@dataclass
class Comparison:
    runs: list[int]
    rows: list[Row] = field(default_factory=list)
    # Per schema, per run: {"labels", "confusion"} (rows gold, columns predicted), or None.
    confusions: dict[str, list[dict[str, Any] | None]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "sections": list(SECTIONS),
                "rows": [{"section": r.section, "name": r.name, "values": list(r.values), "differs": r.differs}
                         for r in self.rows],
                "confusions": self.confusions}

    def text(self) -> str:
        """The command's output: a table per section, ``*`` before each row where the runs differ."""
        header = ("", *(f"run {i}" for i in self.runs))
        width = [max(len(r.name) for r in self.rows + [Row("", "", ())]) + 2]
        width += [max([len(header[k + 1])] + [len(r.values[k]) for r in self.rows]) for k in range(len(self.runs))]
        out = [f"Runs {_listed(self.runs)} side by side; * marks what differs", "",
               "  " + "  ".join(h.ljust(w) for h, w in zip(header, width)).rstrip()]
        for section in SECTIONS:
            rows = [r for r in self.rows if r.section == section]
            if rows:
                out.append(section)
                out += [("* " if r.differs else "  ") + "  ".join(c.ljust(w) for c, w in
                                                                   zip(("  " + r.name, *r.values), width)).rstrip()
                        for r in rows]
        for schema, matrices in self.confusions.items():
            out += ["", f"Confusion matrices of {schema} (rows: the annotators' label; columns: the model's)"]
            for run_id, shown in zip(self.runs, matrices):
                out.append(f"  run {run_id}:" + ("" if shown else f" {MISSING}"))
                if shown:
                    out += _matrix(shown["labels"], shown["confusion"])
        return "\n".join(out)


def _listed(ids: Sequence[int]) -> str:
    return ", ".join(map(str, ids[:-1])) + f" and {ids[-1]}"


def _matrix(labels: Sequence[str], confusion: Sequence[Sequence[int]]) -> list[str]:
    width = max(len(str(x)) for x in [*labels, *(n for row in confusion for n in row)])
    lines = ["    " + " " * width + "".join(f"  {label:>{width}}" for label in labels)]
    lines += ["    " + f"{label:<{width}}" + "".join(f"  {n:>{width}}" for n in row)
              for label, row in zip(labels, confusion)]
    return lines


def _text(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, float):
        return number_text(value)
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)


class _Facts:
    """What one run has to compare: the store's record, and what record results kept beside it."""

    def __init__(self, config: ProjectConfig, run: Run):
        directory = run_paths(config, run.id).dir
        self.run = run
        self.data = read_training_data(directory) or {}
        self.evaluation = read_evaluation(directory) or {}
        self.labels = {(r["schema"], r["label"]): r for r in label_rows(self.evaluation)}
        self.scores = run.scores if isinstance(run.scores, dict) else {}
        self.options = self.data.get("options") if isinstance(self.data.get("options"), dict) else run.options

    def schema_scores(self, schema: str) -> dict[str, Any]:
        found = self.scores.get(schema)
        return found if isinstance(found, dict) else {}

    def per_schema(self, key: str, schema: str) -> Any:
        found = self.data.get(key)
        return found.get(schema) if isinstance(found, dict) else None


def _union(lists: Sequence[Sequence[str]]) -> list[str]:
    return list(dict.fromkeys(x for one in lists for x in one))


def parse_runs(raw: str | None) -> list[int]:
    """The compare page's and route's ``runs`` query (``7,9``) as run ids; ``CompareError`` says what is wrong."""
    try:
        ids = [int(part) for part in (raw or "").split(",") if part.strip()]
    except ValueError:
        raise CompareError(f"runs={raw!r} is not a list of run ids; name them separated by commas, e.g. "
                           "runs=7,9") from None
    if any(not 1 <= i <= MAX_RUN_ID for i in ids):
        raise CompareError(f"runs={raw!r} names no run: run ids are whole numbers from 1, e.g. runs=7,9")
    return ids


def compare(config: ProjectConfig, store: Store, run_ids: Sequence[int]) -> Comparison:
    """Runs *run_ids* of the project side by side; ``StoreError`` names a run there is none of."""
    ids = list(run_ids)
    if len(ids) < 2:
        raise CompareError("compare needs two runs or more, e.g. potato training compare config.yaml 7 9")
    if len(ids) > MAX_RUNS:
        raise CompareError(f"{len(ids)} runs are too many to read side by side: compare {MAX_RUNS} at most")
    if len(set(ids)) < len(ids):
        raise CompareError(f"run {next(i for i in ids if ids.count(i) > 1)} is named twice: name each run once")
    facts = [_Facts(config, store.get_run(i)) for i in ids]
    comparison = Comparison(ids)
    rows = comparison.rows

    def add(section: str, name: str, values: Sequence[Any]) -> None:
        rows.append(Row(section, name, tuple(_text(v) for v in values)))

    add("Run", "state", [f.run.state for f in facts])
    add("Run", "trainer", [describe_plan(f.run.trainers) for f in facts])
    add("Run", "ran on", [f.run.backend for f in facts])
    add("Run", "device", [f.run.gpu for f in facts])
    add("Run", "duration", [format_duration(run_duration(f.run)) if f.run.finished_at else None for f in facts])
    add("Run", "annotations", [f.run.annotation_count for f in facts])
    for key in sorted(_union([list(f.options) for f in facts])):
        add("Options", key, [f.options.get(key) for f in facts])
    add("Data", "items", [f.data.get("items") for f in facts])
    add("Data", "annotators", [f.data.get("annotators") for f in facts])
    schemas = _union([list(f.run.schemas) for f in facts])
    for schema in schemas:
        add("Data", f"{schema}: labelled", [f.per_schema("labeled", schema) for f in facts])
        add("Data", f"{schema}: held out", [f.per_schema("holdout", schema) for f in facts])
    for schema in schemas:
        keys = _union([[k for k, v in f.schema_scores(schema).items() if isinstance(v, (int, float))
                        and not isinstance(v, bool)] for f in facts])
        for key in keys:
            add("Holdout scores", f"{schema}: {key}", [f.schema_scores(schema).get(key) for f in facts])
    for schema, label in _union([list(f.labels) for f in facts]):
        add("Per label", f"{schema} {label}: F1", [(f.labels.get((schema, label)) or {}).get("f1") for f in facts])
    for schema in schemas:
        curves = [curve_line(schema, f.schema_scores(schema)) for f in facts]
        if any(curves):
            add("Learning curve", schema, [c[len(schema) + 2:] if c else None for c in curves])
    for schema in schemas:
        matrices = [_confusion(f.evaluation, schema) for f in facts]
        if any(matrices):
            comparison.confusions[schema] = matrices
    return comparison


def _confusion(evaluation: dict[str, Any], schema: str) -> dict[str, Any] | None:
    shown = (evaluation.get("schemas") or {}).get(schema)
    if isinstance(shown, dict) and isinstance(shown.get("confusion"), list):
        return {"labels": shown.get("labels") or [], "confusion": shown["confusion"]}
    return None
