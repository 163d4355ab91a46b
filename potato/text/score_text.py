"""One schema's holdout scores in words, as every command and page shows them.

The words come from the run log's line (``potato.training.trainers.metrics.describe``,
which says each kind's own metrics: accuracy and macro-F1, MAE and
Spearman's ρ, exact sets and micro-F1, span F1, …), so the run log, ``potato
training runs``, a followed run, the Training page, the run page and the
Prefect table artifact say the same thing. A store may hold what an older
server let in (a score that is not a mapping): it shows as ``?``.
"""

from __future__ import annotations

from typing import Any

from potato.training.trainers import metrics

_LOG_PREFIX = "Holdout "


def number_text(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def score_line(schema: str, scores: Any) -> str:
    """``sentiment: accuracy 0.950, macro-F1 0.949 (n=40)``; decision-calibrate's ``sentiment: ECE 0.120 -> 0.031 (kept)``."""
    if not isinstance(scores, dict):
        return f"{schema}: ?"
    if "ece_before" in scores:  # decision-calibrate
        kept = "kept" if scores.get("kept") else "backed out"
        return f"{schema}: ECE {number_text(scores.get('ece_before'))} -> {number_text(scores.get('ece_after'))} ({kept})"
    if not metrics.has_holdout(scores):
        return f"{schema}: {metrics.NO_HOLDOUT}"
    text = metrics.describe(schema, scores)
    return text[len(_LOG_PREFIX):] if text.startswith(_LOG_PREFIX) else text


def score_lines(scores: Any) -> list[str]:
    """``score_line`` of each schema, sorted by name; none for scores that are not a mapping."""
    if not isinstance(scores, dict):
        return []
    return [score_line(str(schema), value) for schema, value in sorted(scores.items(), key=lambda kv: str(kv[0]))]


def table_rows(scores: dict[str, Any]) -> list[dict[str, Any]]:
    """The Prefect table artifact's rows: per schema its kind, its line and its flat metrics."""
    rows = []
    for schema, value in scores.items():
        flat = {k: v for k, v in value.items() if not isinstance(v, (dict, list))} if isinstance(value, dict) else {}
        rows.append({"schema": schema, "kind": flat.pop("kind", "nominal"), "scores": score_line(schema, value),
                     **flat})
    return rows


def _curve_of(scores: Any) -> tuple[list[dict[str, Any]], metrics.Main] | None:
    """A schema's learning curve (``potato.training.trainers.learning_curve``) and its kind's main metric, if it has one."""
    if not isinstance(scores, dict) or not isinstance(scores.get("curve"), list):
        return None
    kind = metrics.KINDS.get(scores.get("kind") or "nominal")
    points = [p for p in scores["curve"] if isinstance(p, dict)]
    return (points, kind.main) if kind and points else None


def curve_line(schema: str, scores: Any) -> str | None:
    """``sentiment: learning curve of accuracy, 25 % (10 items) 0.700, …, 100 % (40 items) 0.850; still rising: …``
    (None without a curve)."""
    from potato.training.trainers.learning_curve import verdict

    found = _curve_of(scores)
    if found is None:
        return None
    points, main = found
    shown = ", ".join(f"{100 * p.get('share', 0):.0f} % ({p.get('items', '?')} items) {number_text(p.get(main.key))}"
                      for p in points)
    words = verdict(points, main.key, main.name, main.higher_is_better)
    return f"{schema}: learning curve of {main.name}, {shown}" + (f"; {words}" if words else "")


def curve_lines(scores: Any) -> list[str]:
    """``curve_line`` of each schema with a learning curve, sorted by name."""
    if not isinstance(scores, dict):
        return []
    lines = (curve_line(str(schema), value) for schema, value in sorted(scores.items(), key=lambda kv: str(kv[0])))
    return [line for line in lines if line]


def curve_rows(scores: Any) -> list[dict[str, Any]]:
    """The learning curves as the Prefect table artifact's rows: schema, share, items, the main metric."""
    rows = []
    for schema, value in sorted(scores.items(), key=lambda kv: str(kv[0])) if isinstance(scores, dict) else ():
        found = _curve_of(value)
        if found:
            points, main = found
            rows.extend({"schema": schema, "share": p.get("share"), "items": p.get("items"),
                         main.name: p.get(main.key)} for p in points)
    return rows


def curves_json(scores: Any) -> dict[str, dict[str, Any]]:
    """The learning curves as the run page draws them: per schema its main metric, its points, its line."""
    out = {}
    for schema, value in scores.items() if isinstance(scores, dict) else ():
        found = _curve_of(value)
        if found:
            points, main = found
            out[str(schema)] = {"metric": main.name, "key": main.key, "higher_is_better": main.higher_is_better,
                                "points": points, "text": curve_line(str(schema), value)}
    return out
