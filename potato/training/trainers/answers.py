"""What a trainer needs to know about a schema's answers: its kind, its labels or range, and the rules
that turn the bundle's answers into targets and a model's outputs into predictions.

docs/answer-types.md is the contract: the manifest's ``answers`` entry says a
schema's kind (``nominal``, ``ordinal``, ``continuous``, ``multilabel``, ...,
named as ``potato/training/answer_kinds.py`` names them: that module stays on the
server, so tests/unit/test_trainer_answers.py checks the two agree), and each item's
``labels[schema]`` holds the aggregated answer in the kind's shape. Every
trainer reads them through :class:`SchemaAnswers`, so they agree on which items are
usable and on what a prediction looks like: a slider's value inside its range
and on its step, a multi-label set in schema order with one threshold per label.

Part of the remote half: Python 3.8, standard library only.
"""

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from potato.training.events import TrainerFailure
from potato.training.trainers.uncertainty import MAX_PROBS_LABELS

# A label's threshold is tuned only when the tuning rows hold at least this many items that have it
# and this many that lack it; with fewer, a threshold would follow one or two items, so it stays 0.5.
MIN_TUNING_EXAMPLES = 3
DEFAULT_THRESHOLD = 0.5


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class SchemaAnswers:
    """One schema's answers as its bundle describes them.

    ``kind``; ``labels`` (the schema's labels in order: an ordinal scale from
    low to high; empty for ``continuous`` and ``text``); ``description`` (the
    schema's question as the config words it, "" when the manifest has none);
    for ``continuous``, ``low``, ``high`` and ``step`` (None when the manifest
    gives none: ``low``/``high`` then come from the training answers, see
    :meth:`fit_range`).
    """

    def __init__(self, schema: str, labels: Sequence[Any], spec: Optional[Dict[str, Any]] = None):
        spec = spec if isinstance(spec, dict) else {}
        self.schema = schema
        self.kind = str(spec.get("kind") or "nominal")  # a bundle without answers: every schema nominal
        self.labels = [str(label) for label in labels or ()]
        self._index = {label: i for i, label in enumerate(self.labels)}
        description = spec.get("description")
        self.description = description if isinstance(description, str) else ""
        self.low = float(spec["min"]) if _is_number(spec.get("min")) else None
        self.high = float(spec["max"]) if _is_number(spec.get("max")) else None
        step = spec.get("step")
        self.step = float(step) if _is_number(step) and step > 0 else None

    @classmethod
    def of(cls, manifest: Dict[str, Any], schema: str) -> "SchemaAnswers":
        """The schema's answers in a bundle's ``manifest.json``."""
        return cls(schema, (manifest.get("schemas") or {}).get(schema) or (),
                   (manifest.get("answers") or {}).get(schema))

    def describe(self) -> str:
        """How the run log names the answers: ``labels a, b``, ``scale 1 < 2 < 3``, ``values 0 to 100 in steps of 5``."""
        if self.kind == "continuous":
            if self.low is None or self.high is None:
                return "values (range from the training answers)"
            return "values {:g} to {:g}{}".format(
                self.low, self.high, " in steps of {:g}".format(self.step) if self.step else "")
        if self.kind == "ordinal":
            return "scale " + " < ".join(self.labels)
        if self.kind == "text":
            return "free text"
        if self.kind == "comparison":
            return "comparisons of two responses (A, B or neither)"
        if self.kind == "best_worst":
            return "the best and the worst of tuples of {} ({})".format(len(self.labels), ", ".join(self.labels))
        if self.kind == "ranking":
            return "orders of {} ({})".format(len(self.labels), ", ".join(self.labels))
        return "labels " + ", ".join(self.labels)

    # -- the bundle's answers --------------------------------------------------------

    def gold(self, value: Any) -> Any:
        """The item's answer in this kind's shape, or None when it cannot be trained on.

        ``nominal``/``ordinal``: a label of the schema; ``multilabel``: a
        tuple of labels of the schema, in schema order (possibly empty);
        ``continuous``: a finite number; ``span``: the list of spans as the
        bundle has it (the span trainer checks each against the item's text);
        ``text``: the list of its non-empty answers, stripped (every
        annotator's: the bundle keeps them all); ``comparison``: the counts
        ``{"A": n, "B": n, "tie": n}`` (every annotator's side), some above 0;
        ``best_worst``: ``{"best": {position: n}, "worst": {position: n}}``, some pick;
        ``ranking``: the annotators' orders, each a list of all the labels once, at least one.
        """
        if self.kind in ("nominal", "ordinal"):
            label = str(value) if value is not None else None
            return label if label in self._index else None
        if self.kind == "multilabel":
            if not isinstance(value, (list, tuple)) or not all(str(v) in self._index for v in value):
                return None
            chosen = {str(v) for v in value}
            return tuple(label for label in self.labels if label in chosen)
        if self.kind == "continuous":
            try:
                number = float(value) if isinstance(value, str) else value
            except ValueError:
                return None
            return float(number) if _is_number(number) else None
        if self.kind == "span":
            return value if isinstance(value, list) else None
        if self.kind == "text":
            texts = [value] if isinstance(value, str) else value if isinstance(value, list) else []
            kept = [t.strip() for t in texts if isinstance(t, str) and t.strip()]
            return kept or None
        if self.kind == "comparison":
            if not isinstance(value, dict):
                return None
            counts = {side: value.get(side, 0) for side in ("A", "B", "tie")}
            if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts.values()):
                return None
            return counts if sum(counts.values()) else None
        if self.kind == "best_worst":
            if not isinstance(value, dict):
                return None
            picks = {role: value.get(role) if isinstance(value.get(role), dict) else {} for role in ("best", "worst")}
            if not all(p in self._index and isinstance(n, int) and not isinstance(n, bool) and n > 0
                       for counts in picks.values() for p, n in counts.items()):
                return None
            return picks if any(picks.values()) else None
        if self.kind == "ranking":
            if not (isinstance(value, list) and value and all(
                    isinstance(order, list) and all(isinstance(x, str) for x in order)
                    and sorted(order) == sorted(self.labels) for order in value)):
                return None
            return [list(order) for order in value]
        return None

    def index(self, label: str) -> int:
        return self._index[label]

    def fit_range(self, values: Sequence[float]) -> None:
        """A continuous answer without ``min``/``max`` in the manifest: the training answers' range."""
        if values and self.low is None:
            self.low = min(values)
        if values and self.high is None:
            self.high = max(values)
        if self.low is not None and self.high is not None and self.high <= self.low:
            self.high = self.low + 1.0  # every answer the same: any width keeps the scale finite

    # -- continuous --------------------------------------------------------------------

    def scaled(self, value: float) -> float:
        """A continuous answer as a fraction of the range (0 at ``low``, 1 at ``high``)."""
        return (value - self.low) / (self.high - self.low)

    def snap(self, fraction: float) -> float:
        """A model's output (a fraction of the range) as an answer: inside ``[low, high]``, on ``step``."""
        value = self.low + min(max(fraction, 0.0), 1.0) * (self.high - self.low)
        if self.step:
            steps = round((value - self.low) / self.step)
            value = self.low + steps * self.step
            if value > self.high + 1e-9 * self.step:  # a max that is not on the step: the last step below it
                value -= self.step
            # 0.1 + 2 * 0.1 is 0.30000000000000004: as many decimals as the step and low have
            decimals = max(_decimals(self.step), _decimals(self.low))
            value = round(value, decimals)
        else:
            value = round(value, 6)
        return int(value) if value == int(value) and _integral(self) else value

    # -- multilabel --------------------------------------------------------------------

    def chosen(self, probs: Sequence[float], thresholds: Sequence[float]) -> List[str]:
        """The labels whose probability reaches their threshold, in schema order."""
        return [label for label, p, t in zip(self.labels, probs, thresholds) if p >= t]


def unsupported_kind(schema: str, kind: str, trainer: str, kinds: Sequence[str]) -> str:
    """The failure of a trainer given a schema of a kind it does not train."""
    return "Schema {!r} has {} answers, which {} cannot train; it trains {} schemas".format(
        schema, kind, trainer, _listed(kinds))


def _listed(kinds: Sequence[str]) -> str:
    """``nominal, ordinal and multilabel``."""
    return ", ".join(kinds[:-1]) + " and " + kinds[-1] if len(kinds) > 1 else kinds[0]


def answers_of(manifest: Dict[str, Any], schemas: Sequence[str], trainer: str,
               kinds: Sequence[str]) -> "Dict[str, SchemaAnswers]":
    """Each of ``schemas`` with its answers, checked before anything trains: :class:`TrainerFailure` for a
    schema the bundle does not have or of a kind ``trainer`` does not train. No ``schemas``: every schema
    of the bundle of those ``kinds`` (:class:`TrainerFailure` when there is none)."""
    all_schemas = manifest.get("schemas") or {}
    if not schemas:
        schemas = [schema for schema in all_schemas if SchemaAnswers.of(manifest, schema).kind in kinds]
        if not schemas:
            raise TrainerFailure("The bundle has no schema {} can train; it trains {} schemas".format(
                trainer, _listed(kinds)))
    found = {}  # type: Dict[str, SchemaAnswers]
    for schema in schemas:
        if schema not in all_schemas:
            raise TrainerFailure(
                "Schema {!r} is not in the bundle; it has: {}".format(schema, ", ".join(all_schemas) or "none"))
        found[schema] = SchemaAnswers.of(manifest, schema)
        if found[schema].kind not in kinds:
            raise TrainerFailure(unsupported_kind(schema, found[schema].kind, trainer, kinds))
    return found


class Labelled(object):
    """A schema's items that have a usable answer: ``schema``, ``golds`` (position -> answer in the kind's shape),
    ``train`` and ``holdout`` (positions, in bundle order) and ``positions`` (both)."""

    def __init__(self, schema: str, golds: Dict[int, Any], train: List[int], holdout: List[int]):
        self.schema, self.golds, self.train, self.holdout = schema, golds, train, holdout
        self.positions = sorted(golds)

    def to_predict(self, items: Any, include_unlabeled: bool) -> List[int]:
        """The positions a trainer predicts: these and, with ``include_unlabeled``, the items nobody answered
        in the schema (an item whose answer is there but unusable is neither)."""
        if not include_unlabeled:
            return self.positions
        return self.positions + [i for i in range(len(items)) if self.schema not in items.labels(i)]

    def describe(self, answers: SchemaAnswers) -> str:
        """The run log's line: ``Schema 'sentiment': 96 training items, 24 held out, labels positive, negative``."""
        return "Schema {!r}: {} training items, {} held out, {}".format(
            answers.schema, len(self.train), len(self.holdout), answers.describe())


def gold_answers(items: Any, answers: SchemaAnswers) -> Labelled:
    """The items of ``items`` (the worker's ``ItemIndex``) whose answer to the schema a trainer can use.

    A continuous schema without a range in the manifest takes the training answers'.
    :class:`TrainerFailure` when no training item has one.
    """
    golds = {}  # type: Dict[int, Any]
    for position, item in items.labelled.items():
        value = item["labels"].get(answers.schema)
        gold = None if value is None else answers.gold(value)
        if gold is not None:
            golds[position] = gold
    ordered = sorted(golds)
    train = [i for i in ordered if not items.labelled[i].get("holdout")]
    holdout = [i for i in ordered if items.labelled[i].get("holdout")]
    if not train:
        raise TrainerFailure("Schema {!r} has no labelled items to train on".format(answers.schema))
    if answers.kind == "continuous":
        answers.fit_range([golds[i] for i in train])
    return Labelled(answers.schema, golds, train, holdout)


def _decimals(number: float) -> int:
    text = "{:.10f}".format(abs(number)).rstrip("0")
    return len(text.split(".")[1]) if "." in text else 0


def _integral(answers: SchemaAnswers) -> bool:
    """Whether every answer on the scale is a whole number (so 40.0 is written 40, as a slider shows it)."""
    return all(x is None or float(x).is_integer() for x in (answers.low, answers.high, answers.step))


def most_probable(probs: Sequence[float]) -> int:
    return max(range(len(probs)), key=probs.__getitem__)


def median_point(probs: Sequence[float]) -> int:
    """The median of a distribution over an ordered scale: the point an absolute error is smallest at, on
    average (the most probable point may lie far from most of the mass, e.g. 0.4 / 0 / 0.3 / 0.3)."""
    total = 0.0
    for k, p in enumerate(probs):
        total += p
        if total >= 0.5:
            return k
    return len(probs) - 1


def label_fields(answers: SchemaAnswers, probs: Sequence[float], held_out: bool,
                 chosen: Optional[int] = None) -> Dict[str, Any]:
    """A one-label prediction's fields (``nominal``, ``ordinal``): the ``chosen`` label (by default the most
    probable) and its probability as ``confidence``; the whole distribution too (``probs``), on a held-out
    item for calibration and reliability diagrams, on every item up to ``MAX_PROBS_LABELS`` labels for the
    margin and entropy orders (``potato.training.trainers.uncertainty``)."""
    best = most_probable(probs) if chosen is None else chosen
    fields = {"label": answers.labels[best], "confidence": round(probs[best], 5)}  # type: Dict[str, Any]
    if held_out or len(probs) <= MAX_PROBS_LABELS:
        fields["probs"] = [round(p, 5) for p in probs]
    return fields


def multilabel_fields(answers: SchemaAnswers, probs: Sequence[float], thresholds: Sequence[float]) -> Dict[str, Any]:
    """A multi-label prediction's fields (docs/answer-types.md): ``label``, the chosen set;
    ``confidence``, the model's certainty about its least certain label decision; ``probs``."""
    certainty = [p if p >= t else 1.0 - p for p, t in zip(probs, thresholds)]
    return {"label": answers.chosen(probs, thresholds), "confidence": round(min(certainty) if certainty else 1.0, 5),
            "probs": [round(p, 5) for p in probs]}


# What a threshold is tuned for, from a label's (true positives, false positives, false negatives).
OBJECTIVES = {
    "f1": lambda tp, fp, fn: 2 * tp / (2 * tp + fp + fn) if tp else 0.0,
    "errors": lambda tp, fp, fn: -(fp + fn),  # the fewest wrong decisions: the fewest boxes to change
}


def tune_thresholds(probs: Sequence[Sequence[float]], truth: Sequence[Sequence[bool]],
                    n_labels: int, objective: str = "f1") -> List[float]:
    """One decision threshold per label: the one that scores best on these rows (``OBJECTIVES``).

    ``probs[i][k]`` is item ``i``'s probability of label ``k``, ``truth[i][k]``
    whether it has it. Of the thresholds that tie for the best F1, the middle
    of the widest run is taken, so the choice sits between the items rather
    than on one of them. A label with fewer than ``MIN_TUNING_EXAMPLES``
    items with it or without it keeps ``DEFAULT_THRESHOLD``.
    """
    thresholds = []
    for k in range(n_labels):
        column = sorted(((row[k], bool(t[k])) for row, t in zip(probs, truth)), key=lambda pt: pt[0])
        positives = sum(1 for _, t in column if t)
        if positives < MIN_TUNING_EXAMPLES or len(column) - positives < MIN_TUNING_EXAMPLES:
            thresholds.append(DEFAULT_THRESHOLD)
            continue
        thresholds.append(_best_threshold(column, positives, OBJECTIVES[objective]))
    return thresholds


def _best_threshold(column: List[Tuple[float, bool]], positives: int, score: Any) -> float:
    # Candidate cuts: below the lowest item, between each pair of distinct probabilities, above the top.
    # A cut at position j predicts "has the label" for column[j:].
    cuts = []  # type: List[Tuple[float, float]]  # (score, threshold)
    tp, fp = positives, len(column) - positives
    for j in range(len(column) + 1):
        # (No cut above a probability of exactly 1: a threshold there would still choose it.)
        top_ok = j < len(column) or column[-1][0] < 1.0
        if top_ok and (j == 0 or j == len(column) or column[j][0] != column[j - 1][0]):
            low = column[j - 1][0] if j > 0 else 0.0
            high = column[j][0] if j < len(column) else 1.0
            cuts.append((score(tp, fp, positives - tp), (low + high) / 2))
        if j < len(column):
            if column[j][1]:
                tp -= 1
            else:
                fp -= 1
    best = max(value for value, _ in cuts)
    runs, current = [], []  # type: List[List[float]], List[float]
    for value, threshold in cuts:
        if value == best:
            current.append(threshold)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    widest = max(runs, key=lambda run: (run[-1] - run[0], -abs((run[0] + run[-1]) / 2 - DEFAULT_THRESHOLD)))
    return round((widest[0] + widest[-1]) / 2, 5)
