"""The quality gate: a run's predictions reach annotators only when the run is worth showing.

Judged per schema at record results, after the holdout evaluation
(``runs/<id>/labels.jsonl``, ``potato.results.evaluation``) and before the writeback.
A schema of the run is written back unless one of these holds, checked in
this order (the first that holds is the verdict):

1. **Pinned.** The run annotators see now for the schema is pinned
   (``potato training pin``): nothing replaces it until it is unpinned.
2. **One answer for everything.** A label or scale schema whose training
   answers hold at least two labels, predicted with one label on every one
   of its (at least ten) predictions; a number schema with one value for all.
   An over-confident model passes ``min_confidence`` with every prediction,
   so this is checked whatever the holdout says.
3. **No better than the trivial baseline.** The baseline answers every
   held-out item the same way, from the training answers: the commonest
   label (a scale: its median point), the training mean of a number, each
   label of a multi-label schema that more than half the training items
   carry, no span, the commonest text, the side the training majorities
   prefer most often (a comparison: a position bias), one order for every
   item (a ranking: the training answers' Borda count). The run must beat
   it on the schema's main holdout score (accuracy; MAE for a scale or a
   number; micro-F1 of a multi-label schema; span F1; exact match of a
   text; agreement with the majority of a comparison; pairwise agreement
   with each annotator's order of a ranking) in at least
   ``writeback.gate_confidence`` (0.9) of 1 000 paired bootstrap resamples
   of the held-out answers: with 9 held-out answers a lucky model is not
   told apart from a baseline, with 500 a small gain is.
4. **Worse than the run annotators see now.** On the held-out answers both
   runs scored (the same items: the holdout is drawn per item), the new run
   is below the live one in at least ``gate_confidence`` of the resamples.

A schema with fewer held-out answers than ``writeback.min_holdout`` (5) is
not judged by 3 and 4 — a project's first runs have almost none — and the
run log says so. ``writeback.gate: false`` turns the gate off.

A schema held back leaves what annotators see as it was (the live run's
predictions stay; ``potato.results.writeback`` keeps the lines of schemas a run does
not write). The run still succeeds; the run log, ``potato training runs``,
the run page and the Training page say why, and ``potato training promote``
(the run page's button, the admin API) writes it back anyway. The verdicts
are kept in ``runs/<id>/gate.json``.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from potato.config import ProjectConfig
from potato.items.json_lines import load_line, read_lines
from potato.prefill.prediction_shapes import schema_records
from potato.results.writeback import live_runs_by_schema
from potato.runs.paths import RunPaths, private_dir, run_paths
from potato.training import atomic_files
from potato.training.answer_kinds import (
    COMPARISON,
    CONTINUOUS,
    MULTILABEL,
    NOMINAL,
    ORDINAL,
    RANKING,
    SIDES,
    SPAN,
    TEXT,
    TIE,
    borda_order,
    majority_side,
)
from potato.training.escaping import json_bytes
from potato.training.trainers import metrics

RESAMPLES = 1000
# Fewer predictions than this, all of one label, may be a small project's honest answer.
COLLAPSE_MIN_PREDICTIONS = 10
PINS_FILE = "pinned.json"


@dataclass
class Verdict:
    """One schema's verdict: written back or held back, and the sentence that says why."""

    schema: str
    written: bool
    text: str
    rule: str  # "passed", "unjudged", "off", "pinned", "collapsed", "baseline", "live"
    metric: str | None = None
    score: float | None = None
    baseline: float | None = None
    n: int = 0
    live_run: int | None = None
    live_score: float | None = None


# -- per kind: an item's contribution to the main score, and the trivial baseline's answer -------------------


def _f1(stats: Sequence[tuple[int, int, int]]) -> float:
    tp, fp, fn = (sum(s[k] for s in stats) for k in range(3))
    return 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)


def _mean(stats: Sequence[float]) -> float:
    return sum(stats) / len(stats)


def _ratio(stats: Sequence[tuple[float, int]]) -> float:
    """Matched over counted, summed over the items (an item may count none: a tie, a ranking of one)."""
    counted = sum(s[1] for s in stats)
    return sum(s[0] for s in stats) / counted if counted else 0.0


def _sided(gold: Any, predicted: Any) -> tuple[float, int]:
    """A comparison: whether the predicted side is the majority's, counted only when there is one."""
    side = majority_side(gold)
    return (0.0, 0) if side == TIE else (float(predicted == side), 1)


def _spans(value: Any) -> set[tuple[int, int, str]]:
    return {(s["start"], s["end"], s["label"]) for s in value or ()}


def _counts(gold: set, found: set) -> tuple[int, int, int]:
    return len(gold & found), len(found - gold), len(gold - found)


def _normal(text: str) -> str:
    return " ".join(str(text).split())


def _texts(gold: Any) -> list[str]:
    return [gold] if isinstance(gold, str) else [str(g) for g in gold or ()]


class _Kind:
    """How the gate scores one kind: the metric's name, which way is better, per-item stats, the baseline."""

    def __init__(self, metric: str, higher: bool, stat: Callable[[Any, Any, Sequence[str]], Any],
                 total: Callable[[Sequence[Any]], float]):
        self.metric, self.higher, self.stat, self.total = metric, higher, stat, total

    def better(self, a: float, b: float) -> bool:
        return a > b if self.higher else a < b


def _position(labels: Sequence[str], label: Any) -> int:
    return list(labels).index(label)


def _main(kind: str, stat: Callable[[Any, Any, Sequence[str]], Any], total: Callable[[Sequence[Any]], float]) -> _Kind:
    """The kind's own main holdout score (``potato.training.trainers.metrics``), item by item."""
    main = metrics.KINDS[kind].main
    return _Kind(main.name, main.higher_is_better, stat, total)


KINDS = {
    NOMINAL: _main(NOMINAL, lambda g, p, labels: float(g == p), _mean),
    ORDINAL: _main(ORDINAL, lambda g, p, labels: abs(_position(labels, g) - _position(labels, p)), _mean),
    CONTINUOUS: _main(CONTINUOUS, lambda g, p, labels: abs(float(g) - float(p)), _mean),
    MULTILABEL: _main(MULTILABEL, lambda g, p, labels: _counts(set(g or ()), set(p or ())), _f1),
    SPAN: _main(SPAN, lambda g, p, labels: _counts(_spans(g), _spans(p)), _f1),
    # A text's main score, chrF, is a corpus's: no item's share of it to resample. Exact match is.
    TEXT: _Kind("exact match", True, lambda g, p, labels: float(_normal(p) in {_normal(t) for t in _texts(g)}), _mean),
    COMPARISON: _main(COMPARISON, lambda g, p, labels: _sided(g, p), _ratio),
    RANKING: _main(RANKING, lambda g, p, labels: metrics.pairs_kept(g, p), _ratio),
}
# Where a held-out line of labels.jsonl keeps the prediction (potato.results.evaluation).
ANSWER_FIELD = {CONTINUOUS: "value", SPAN: "spans", TEXT: "text", RANKING: "order"}


def _baseline(kind: str, training: Sequence[Any], labels: Sequence[str]) -> tuple[Any, str]:
    """The trivial baseline's one answer for every item, from the training answers, and its words."""
    if kind == NOMINAL:
        counts = Counter(training)
        label = max(labels, key=lambda name: counts.get(name, 0)) if labels else counts.most_common(1)[0][0]
        return label, f"always answering `{label}`"
    if kind == ORDINAL:
        positions = sorted(_position(labels, g) for g in training)
        label = labels[positions[(len(positions) - 1) // 2]]
        return label, f"always answering `{label}` (the training answers' median)"
    if kind == CONTINUOUS:
        mean = statistics.fmean(float(g) for g in training)
        return mean, f"always answering the training mean, {mean:.4g}"
    if kind == MULTILABEL:
        counts = Counter(label for g in training for label in set(g or ()))
        chosen = [label for label in labels if counts.get(label, 0) * 2 > len(training)]
        return chosen, ("always answering " + ", ".join(f"`{c}`" for c in chosen) if chosen
                        else "answering no label")
    if kind == SPAN:
        return [], "predicting nothing"
    if kind == COMPARISON:  # the side a position bias would pick
        counts = Counter(majority_side(g) for g in training)
        side = max(SIDES, key=lambda name: counts.get(name, 0))
        return side, f"always preferring `{side}` (the training answers' commonest majority)"
    if kind == RANKING:  # one order for every item, the one the labels' places alone would give
        order = borda_order([order for orders in training for order in orders], labels)[0]
        return order, f"always answering `{' > '.join(order)}` (the training answers' Borda count)"
    counts = Counter(_normal(t) for g in training for t in _texts(g)[:1])
    if not counts:
        return "", "answering nothing"
    text = counts.most_common(1)[0][0]
    return text, f"always answering the commonest text, `{text[:40]}`"


# -- the run's own record of its holdout -----------------------------------------------------------------------


@dataclass
class _Holdout:
    kind: str
    labels: list[str]
    training: list[Any]
    held: dict[str, tuple[Any, Any]]  # id -> (gold, predicted)


def _read_holdouts(path: Path, kinds: dict[str, str], labels: dict[str, list[str]]) -> dict[str, _Holdout]:
    found = {s: _Holdout(kinds[s], labels[s], [], {}) for s in kinds}
    for line in read_lines(path):
        holdout = found.get(line.get("schema"))
        if holdout is None:
            continue
        if not line.get("holdout"):
            holdout.training.append(line["gold"])
        else:
            answer = ANSWER_FIELD.get(holdout.kind, "label")
            if answer in line:
                holdout.held[line["id"]] = (line["gold"], line[answer])
    return found


def _stats(kind: _Kind, pairs: Iterable[tuple[Any, Any]], labels: Sequence[str]) -> list[Any]:
    return [kind.stat(gold, predicted, labels) for gold, predicted in pairs]


def _share_better(kind: _Kind, ours: Sequence[Any], theirs: Sequence[Any], seed: int) -> float:
    """The share of paired bootstrap resamples of the items in which *ours* scores better than *theirs*."""
    rng, n, wins = random.Random(seed), len(ours), 0
    for _ in range(RESAMPLES):
        picks = [rng.randrange(n) for _ in range(n)]
        wins += kind.better(kind.total([ours[i] for i in picks]), kind.total([theirs[i] for i in picks]))
    return wins / RESAMPLES


def _one_answer(predictions: Path, schema: str, kind: str) -> tuple[Any, int] | None:
    """``(answer, count)`` when every prediction of *schema* is the same label (value), else None."""
    field, seen, count = "value" if kind == CONTINUOUS else "label", None, 0
    for record in schema_records(predictions, schema):
        if field not in record:
            continue
        if count and record[field] != seen:
            return None
        seen, count = record[field], count + 1
    return (seen, count) if count else None


# -- the verdicts ----------------------------------------------------------------------------------------------


def _number(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 100 else f"{value:.4g}"


def judge(config: ProjectConfig, run_id: int, kinds: dict[str, str], labels: dict[str, list[str]]) -> list[Verdict]:
    """Each of the run's writeback schemas' verdict (rules: module docstring). *kinds* and *labels*: the
    run's schemas' answer kinds and label lists, as its bundle's manifest holds them."""
    wb = config.model_training.writeback
    schemas = [s for s in kinds if s in wb.schemas]
    if not schemas:
        return []
    if not wb.gate:
        return [Verdict(s, True, f"{s}: written back unjudged (writeback.gate is false)", "off") for s in schemas]
    paths = run_paths(config, run_id)
    promote = f"`potato training promote {config.path} {run_id}` writes them back anyway"
    live = live_runs_by_schema(config)
    pinned = read_pins(config)
    ours = _read_holdouts(paths.labels, {s: kinds[s] for s in schemas}, labels)
    earlier: dict[int, dict[str, _Holdout]] = {}
    verdicts = []
    for schema in schemas:
        holdout, kind = ours[schema], KINDS[kinds[schema]]
        live_run = live.get(schema)
        if live_run is not None and live_run != run_id and live_run in pinned:
            verdicts.append(Verdict(schema, False, f"{schema}: run {live_run} is pinned, so annotators keep its "
                                    f"predictions (`potato training unpin {config.path} {live_run}` lets newer "
                                    f"runs replace them); {promote}", "pinned", live_run=live_run))
            continue
        if kinds[schema] in (NOMINAL, ORDINAL, CONTINUOUS) and len(set(map(repr, holdout.training))) >= 2:
            one = _one_answer(paths.predictions, schema, kinds[schema])
            if one is not None and one[1] >= COLLAPSE_MIN_PREDICTIONS:
                verdicts.append(Verdict(schema, False, f"{schema}: every one of its {one[1]} predictions is "
                                        f"`{one[0]}`, though its training answers hold more than one; its "
                                        f"predictions were not written back ({promote})", "collapsed"))
                continue
        n = len(holdout.held)
        if n < wb.min_holdout or not holdout.training:
            verdicts.append(Verdict(schema, True, f"{schema}: only {n} held-out answer(s) (writeback.min_holdout: "
                                    f"{wb.min_holdout}), too few to judge the model: written back unjudged",
                                    "unjudged", n=n))
            continue
        baseline, words = _baseline(kinds[schema], holdout.training, holdout.labels)
        pairs = list(holdout.held.values())
        mine = _stats(kind, pairs, holdout.labels)
        trivial = _stats(kind, [(gold, baseline) for gold, _ in pairs], holdout.labels)
        score, base = kind.total(mine), kind.total(trivial)
        facts = dict(metric=kind.metric, score=round(score, 4), baseline=round(base, 4), n=n)
        if _share_better(kind, mine, trivial, run_id) < wb.gate_confidence:
            verdicts.append(Verdict(schema, False, f"{schema}: holdout {kind.metric} {_number(score)} is no better "
                                    f"than {words} ({_number(base)}) on {n} held-out answers; its predictions "
                                    f"were not written back ({promote})", "baseline", **facts))
            continue
        if live_run is not None and live_run != run_id:
            if live_run not in earlier:
                earlier[live_run] = _read_holdouts(run_paths(config, live_run).labels,
                                                   {s: kinds[s] for s in schemas}, labels)
            theirs_held = earlier[live_run][schema].held
            shared = sorted(set(holdout.held) & set(theirs_held))
            if len(shared) >= wb.min_holdout:
                new = _stats(kind, [holdout.held[i] for i in shared], holdout.labels)
                old = _stats(kind, [(holdout.held[i][0], theirs_held[i][1]) for i in shared], holdout.labels)
                if _share_better(kind, old, new, run_id) >= wb.gate_confidence:
                    verdicts.append(Verdict(
                        schema, False, f"{schema}: holdout {kind.metric} {_number(kind.total(new))} is below run "
                        f"{live_run}'s {_number(kind.total(old))} on the {len(shared)} held-out answers both runs "
                        f"scored; annotators keep run {live_run}'s predictions ({promote})", "live",
                        live_run=live_run, live_score=round(kind.total(old), 4), **facts))
                    continue
        verdicts.append(Verdict(schema, True, f"{schema}: holdout {kind.metric} {_number(score)} beats {words} "
                                f"({_number(base)}) on {n} held-out answers: written back", "passed", **facts))
    return verdicts


# -- what is kept: the verdicts of a run, the pins of a project --------------------------------------------------


def save(paths: RunPaths, verdicts: Sequence[Verdict], promoted: dict[str, Any] | None = None) -> None:
    atomic_files.write_bytes(paths.gate, json_bytes(
        {"schemas": [asdict(v) for v in verdicts], **({"promoted": promoted} if promoted else {})}, indent=2))


def read(paths: RunPaths) -> dict[str, Any] | None:
    """A run's ``gate.json``, or None (no verdict: the gate came after it, or its directory is gone)."""
    try:
        return load_line(paths.gate.read_bytes())
    except (OSError, ValueError):
        return None


def held_back(paths: RunPaths) -> list[dict[str, Any]]:
    """The verdicts of a run's schemas that were held back and not promoted since."""
    gate = read(paths)
    if not gate or gate.get("promoted"):
        return []
    return [v for v in gate.get("schemas", []) if not v.get("written")]


def mark_promoted(paths: RunPaths, by: str) -> None:
    gate = read(paths) or {"schemas": []}
    gate["promoted"] = {"at": time.time(), "by": by}
    atomic_files.write_bytes(paths.gate, json_bytes(gate, indent=2))


def _pins_path(config: ProjectConfig) -> Path:
    return config.training_dir / PINS_FILE


def read_pins(config: ProjectConfig) -> set[int]:
    try:
        runs = load_line(_pins_path(config).read_bytes()).get("runs", [])
    except (OSError, ValueError, AttributeError):
        return set()
    return {r for r in runs if isinstance(r, int) and not isinstance(r, bool)}


def set_pinned(config: ProjectConfig, run_id: int, pinned: bool) -> None:
    runs = read_pins(config)
    runs = runs | {run_id} if pinned else runs - {run_id}
    private_dir(config.training_dir)
    atomic_files.write_bytes(_pins_path(config), json_bytes({"runs": sorted(runs)}, indent=2))
