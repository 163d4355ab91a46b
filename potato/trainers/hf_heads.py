"""The output layer of ``hf-text-classification`` for each kind of answer.

A head says how many outputs the model's classification layer has, the loss
that trains them, and how a row of outputs becomes a prediction
(docs/answer-types.md). The training loop, prediction and data-parallel code
are the same for every kind; only the head differs. The choices, measured
with bench/answer_heads.py (the alternatives that lost live there):

- ``nominal``: softmax over the labels, cross-entropy;
- ``multilabel``: one sigmoid per label, binary cross-entropy, and a decision
  threshold per label tuned on the training items (see :class:`Multilabel`);
- ``ordinal``: one output, the point's position on the scale, trained as a
  regression; the answer is the nearest point (see :class:`Ordinal`);
- ``continuous``: one output, the answer as a fraction of its range, trained
  with the squared error; the answer is put inside the range, on the step.

Measured on rated reviews (the tiny model, 600 training and 400 held-out
reviews, 3 seeds): for a 1-5 rating, regression MAE 0.273 and exact matches
0.743, against a softmax over the points 0.388 / 0.672 (its median point
0.359 / 0.683) and one sigmoid per step ("above point k") 0.299 / 0.717; for
a 0-100 score, the squared error MAE 5.83, the absolute error 6.66, a
softmax over 21 bins read as its expected value 13.39.

Part of the remote half: importing this module loads only the standard
library; torch is passed in.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from potato.trainers.answers import Answers, label_fields, multilabel_fields, tune_thresholds

# An ordinal prediction's spread (in points of the scale): before it is measured, and at least.
DEFAULT_SPREAD = 0.5
MIN_SPREAD = 0.05


class Head:
    """Softmax over the schema's labels, trained with cross-entropy: the ``nominal`` head."""

    problem_type = "single_label_classification"

    def __init__(self, answers: Answers):
        self.answers = answers

    @property
    def num_outputs(self) -> int:
        return len(self.answers.labels)

    def id2label(self) -> Dict[int, str]:
        return dict(enumerate(self.answers.labels))

    def split(self, train: List[int], seed: int) -> Tuple[List[int], List[int]]:
        """``(items to train on, items whose outputs :meth:`tune` fits the decision to)`` of the training items."""
        return train, []

    def target(self, gold: Any) -> Any:
        return self.answers.index(gold)

    def targets(self, torch: Any, targets: List[Any]) -> Any:
        return torch.tensor(targets, dtype=torch.long)

    def loss(self, torch: Any, logits: Any, y: Any) -> Any:
        """The batch's loss, summed over its rows (``logits`` in fp32)."""
        return torch.nn.functional.cross_entropy(logits, y, reduction="sum")

    def activate(self, torch: Any, logits: Any) -> Any:
        """The outputs a prediction is made of, per row (``logits`` in fp32)."""
        return torch.softmax(logits, dim=-1)

    def tune(self, outputs: List[List[float]], golds: List[Any]) -> Optional[str]:
        """Fit the decision to the tuning items' outputs; returns what the run log says about it."""
        return None

    def answer(self, outputs: List[float]) -> Any:
        """The predicted answer, as the metrics compare it with the gold one."""
        return self.answers.labels[max(range(len(outputs)), key=outputs.__getitem__)]

    def record(self, outputs: List[float], held_out: bool) -> Dict[str, Any]:
        """The prediction's fields beside ``id`` and ``schema``."""
        return label_fields(self.answers, outputs, held_out)

    def saved(self) -> Dict[str, Any]:
        """What ``labels.json`` records to read the saved model's outputs."""
        return {"kind": self.answers.kind}


class Multilabel(Head):
    """One sigmoid per label, binary cross-entropy, one threshold per label.

    Each label's threshold is the one that gives it the best F1 on the
    training items, after training on all of them. Measured on rated reviews
    (bench/answer_heads.py; the tiny model, 600 training and 400 held-out
    reviews, 3 seeds), against holding 20 % of the training items back from
    training to tune on: micro-F1 0.616 against 0.583, macro-F1 0.592 against
    0.562, exact sets 0.334 against 0.263 (0.5 everywhere: 0.578, 0.509,
    0.354). The held-back items cost the model a fifth of its data, and that
    costs more than tuning on items it has seen. A model sure of every
    training item leaves a wide gap between their probabilities, and the
    middle of it is taken (:func:`tune_thresholds`): near 0.5, as if untuned,
    rather than on an item's edge. Tuning for the fewest wrong boxes instead
    of F1 gave more exact sets (0.357) and lower F1 (0.579, 0.518): a rare
    label was then seldom ticked at all.
    """

    problem_type = "multi_label_classification"

    def __init__(self, answers: Answers):
        super().__init__(answers)
        self.thresholds = [0.5] * len(answers.labels)

    def split(self, train: List[int], seed: int) -> Tuple[List[int], List[int]]:
        return train, list(train)

    def target(self, gold: Any) -> Any:
        chosen = set(gold)
        return [1.0 if label in chosen else 0.0 for label in self.answers.labels]

    def targets(self, torch: Any, targets: List[Any]) -> Any:
        return torch.tensor(targets, dtype=torch.float32)

    def loss(self, torch: Any, logits: Any, y: Any) -> Any:
        # Mean over the labels, sum over the rows: a row weighs as much as a nominal one.
        per_label = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none")
        return per_label.mean(dim=-1).sum()

    def activate(self, torch: Any, logits: Any) -> Any:
        return torch.sigmoid(logits)

    def tune(self, outputs: List[List[float]], golds: List[Any]) -> Optional[str]:
        truth = [[label in set(gold) for label in self.answers.labels] for gold in golds]
        self.thresholds = tune_thresholds(outputs, truth, len(self.answers.labels))
        return "thresholds tuned on its {} training items: {}".format(
            len(golds), ", ".join("{} {:.2f}".format(label, t) for label, t in zip(self.answers.labels, self.thresholds)))

    def answer(self, outputs: List[float]) -> Any:
        return self.answers.chosen(outputs, self.thresholds)

    def record(self, outputs: List[float], held_out: bool) -> Dict[str, Any]:
        return multilabel_fields(self.answers, outputs, self.thresholds)

    def saved(self) -> Dict[str, Any]:
        return {"kind": self.answers.kind, "thresholds": self.thresholds}


class Regression(Head):
    """One output, a fraction of a scale (the subclass says which), trained with the squared error."""

    problem_type = "regression"

    @property
    def num_outputs(self) -> int:
        return 1

    def id2label(self) -> Dict[int, str]:
        return {0: self.answers.schema}

    def targets(self, torch: Any, targets: List[Any]) -> Any:
        return torch.tensor(targets, dtype=torch.float32)

    def loss(self, torch: Any, logits: Any, y: Any) -> Any:
        return torch.nn.functional.mse_loss(logits.squeeze(-1), y, reduction="sum")

    def activate(self, torch: Any, logits: Any) -> Any:
        return logits


class Ordinal(Regression):
    """One output, the point's position on the scale (0 the lowest point, 1 the highest), trained with the
    squared error; the answer is the nearest point.

    A regression learns that 4 is between 3 and 5, which a softmax over the
    points has to find out from the data (see the module's numbers).
    A prediction still names a label with a confidence, and a held-out one
    all the points' probabilities, as a one-label schema's do: they come from
    a normal distribution around the output, as wide as the model's
    root-mean-square error on its training items (:meth:`tune`; measured on
    the items it trained on, so if anything too narrow).
    """

    def __init__(self, answers: Answers):
        super().__init__(answers)
        self.spread = DEFAULT_SPREAD

    def split(self, train: List[int], seed: int) -> Tuple[List[int], List[int]]:
        return train, list(train)  # trained on all; the spread measured on the same items

    def _position(self, outputs: List[float]) -> float:
        return outputs[0] * (len(self.answers.labels) - 1)

    def target(self, gold: Any) -> Any:
        return self.answers.index(gold) / (len(self.answers.labels) - 1)

    def tune(self, outputs: List[List[float]], golds: List[Any]) -> Optional[str]:
        errors = [self._position(out) - self.answers.index(gold) for out, gold in zip(outputs, golds)]
        self.spread = max(MIN_SPREAD, math.sqrt(sum(e * e for e in errors) / len(errors)))
        return "its output is off by {:.2f} points on its training items (root-mean-square)".format(self.spread)

    def probabilities(self, outputs: List[float]) -> List[float]:
        position = self._position(outputs)
        weights = [math.exp(-0.5 * ((k - position) / self.spread) ** 2) for k in range(len(self.answers.labels))]
        total = sum(weights)
        if total == 0.0:  # far outside the scale: all the mass on the nearest end
            return [1.0 if k == self._nearest(outputs) else 0.0 for k in range(len(weights))]
        return [w / total for w in weights]

    def _nearest(self, outputs: List[float]) -> int:
        return min(len(self.answers.labels) - 1, max(0, int(round(self._position(outputs)))))

    def answer(self, outputs: List[float]) -> Any:
        return self.answers.labels[self._nearest(outputs)]

    def record(self, outputs: List[float], held_out: bool) -> Dict[str, Any]:
        return label_fields(self.answers, self.probabilities(outputs), held_out, self._nearest(outputs))

    def saved(self) -> Dict[str, Any]:
        return {"kind": self.answers.kind, "spread": round(self.spread, 5)}


class Continuous(Regression):
    """One output, the answer as a fraction of its range, trained with the squared error."""

    def target(self, gold: Any) -> Any:
        return self.answers.scaled(gold)

    def answer(self, outputs: List[float]) -> Any:
        return self.answers.snap(outputs[0])

    def record(self, outputs: List[float], held_out: bool) -> Dict[str, Any]:
        return {"value": self.answer(outputs)}

    def saved(self) -> Dict[str, Any]:
        a = self.answers
        return {"kind": a.kind, "min": a.low, "max": a.high, "step": a.step}


HEADS = {"nominal": Head, "ordinal": Ordinal, "continuous": Continuous, "multilabel": Multilabel}
KINDS = tuple(HEADS)


def make_head(answers: Answers) -> Head:
    """The head for ``answers``' kind (one of ``KINDS``)."""
    return HEADS[answers.kind](answers)
