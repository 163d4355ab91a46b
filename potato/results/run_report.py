"""A run's report for Prefect's Artifacts page: its scores per schema and label, and what annotators now see.

Three artifacts per run (a fourth once it is published), each keyed per project (``artifact_key``), so the
Artifacts page keeps one history per project with a version per run — the
run-keyed ``run-N-scores`` table beside them says which run is which:

- ``potato-<project>-report`` (markdown): the holdout scores in the run
  log's words, a per-label table for each label schema, the learning curve
  where there is one, and what was written back, what was held back and why
  (the quality gate's verdicts and the writeback's counts);
- ``potato-<project>-label-scores`` (table): precision, recall, F1 and the
  held-out answers per schema and label (``label_rows``);
- ``potato-<project>-run-page`` (link): the run's page, when the annotation
  server has said where its Training page is (``potato start`` records it);
- ``potato-<project>-hub-repo`` (link): the Hugging Face Hub repository, once
  the run is published (``potato.publish.prefect_link``).

Everything here is pure: it reads what record results kept beside the run
(``evaluation.json``, ``gate.json``, ``writeback.json``) and builds text;
the flow creates the artifacts. What it returns always encodes as UTF-8 (a
lone surrogate in a label is written as its escape), as Prefect's API needs.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from potato.results.writeback import report_lines
from potato.text.markdown_text import md, table
from potato.text.score_text import curve_lines, number_text, score_line
from potato.training.escaping import escaped

REPORT, LABEL_SCORES, RUN_PAGE, HUB_REPO = "report", "label-scores", "run-page", "hub-repo"
# What Prefect accepts as an artifact's key.
_KEY = re.compile(r"[a-z0-9-]+")


def artifact_key(project_key: str, what: str) -> str:
    """``potato-<project>-<what>``: the project's key (``potato.runs.prefect_runs.project_key``) is already lowercase
    letters, digits and dashes, as Prefect wants a key to be."""
    key = f"potato-{project_key}-{what}"
    if not _KEY.fullmatch(key):
        raise ValueError(f"not a Prefect artifact key: {key!r}")
    return key


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _f1(tp: int, fp: int, fn: int) -> float | None:
    return _ratio(2 * tp, 2 * tp + fp + fn)


def _row(schema: str, label: str, tp: int, fp: int, fn: int) -> dict[str, Any]:
    return {"schema": escaped(schema), "label": escaped(label), "precision": _ratio(tp, tp + fp), "recall": _ratio(tp, tp + fn),
            "f1": _f1(tp, fp, fn), "held_out": tp + fn}


def label_rows(evaluation: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Per schema and label: precision, recall, F1 and the held-out answers of that label (``held_out``), from
    the run's holdout evaluation — a label schema's confusion matrix, a multilabel or span schema's counts.
    Schemas whose answers have no labels (a number, a text) have no rows."""
    rows = []
    schemas = (evaluation or {}).get("schemas") or {}
    for schema, shown in sorted(schemas.items()):
        if not isinstance(shown, dict):
            continue
        confusion, labels = shown.get("confusion"), shown.get("labels") or []
        if isinstance(confusion, list) and len(confusion) == len(labels):
            for i, label in enumerate(labels):
                tp = confusion[i][i]
                rows.append(_row(schema, label, tp, sum(r[i] for r in confusion) - tp, sum(confusion[i]) - tp))
        for counts in shown.get("per_label") or ():
            if isinstance(counts, dict):
                rows.append(_row(schema, str(counts.get("label")), *(int(counts.get(k) or 0) for k in ("tp", "fp", "fn"))))
    return rows


def _per_label_tables(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    out: list[str] = []
    for schema in dict.fromkeys(r["schema"] for r in rows):
        out += [f"### Per label: {md(schema)}", ""]
        out += table(("label", "precision", "recall", "F1", "held-out answers"),
                     [(md(r["label"]), number_text(r["precision"]), number_text(r["recall"]), number_text(r["f1"]),
                       r["held_out"]) for r in rows if r["schema"] == schema])
        out.append("")
    return out


def _annotators_see(writeback: Mapping[str, Any] | None, gate: Mapping[str, Any] | None) -> list[str]:
    """What the writeback did (its report's lines, the gate's verdicts among them), else the gate's verdicts:
    every schema held back, nothing was written."""
    if writeback:
        return report_lines(writeback)
    verdicts = [v.get("text") for v in (gate or {}).get("schemas", ()) if isinstance(v, dict) and v.get("text")]
    return verdicts or ["Nothing was written back: no schema of this run is in model_training.writeback.schemas"]


def report_markdown(run_id: int, project: str, scores: Mapping[str, Any], evaluation: Mapping[str, Any] | None,
                    gate: Mapping[str, Any] | None, writeback: Mapping[str, Any] | None,
                    run_page: str | None = None) -> str:
    """The ``report`` artifact: scores, per-label tables, learning curves and what annotators see, in Markdown."""
    out = [f"# Run {run_id} of {md(project)}", ""]
    if run_page:
        out += [f"[The run's page]({run_page})", ""]
    out += ["## Holdout scores", ""]
    out += [f"- {md(score_line(str(schema), value))}" for schema, value in sorted(scores.items())] or ["- none"]
    out.append("")
    out += _per_label_tables(label_rows(evaluation))
    curves = curve_lines(scores)
    if curves:
        out += ["## Learning curve", "", *(f"- {md(line)}" for line in curves), ""]
    out += ["## What annotators see", "", *(f"- {md(line)}" for line in _annotators_see(writeback, gate)), ""]
    # Prefect's API takes UTF-8 only: a label or a name with a lone surrogate shows as its escape.
    return escaped("\n".join(out))
