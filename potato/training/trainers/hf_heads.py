"""The output layer of ``hf-text-classification`` for each kind of answer.

A head says how many outputs the model's classification layer has, the loss
that trains them, and how a row of outputs becomes a prediction
(docs/answer-types.md). The training loop, prediction and data-parallel code
are the same for every kind; only the head differs. The choices, measured
with bench/answer_heads.py (the alternatives that lost live there):

- ``nominal``: softmax over the labels, cross-entropy;
- ``multilabel``: one sigmoid per label, binary cross-entropy, and a decision
  threshold per label tuned on the training items (see :class:`Multilabel`);
- ``ordinal``: one sigmoid per step of the scale, "above this point", with
  binary cross-entropy; the answer is the first point it is not above (see
  :class:`Ordinal`);
- ``continuous``: one output, the answer as a fraction of its range, trained
  with the squared error; the answer is put inside the range, on the step.

Measured on rated reviews (bench/answer_heads.py). A 1-5 rating, MAE and
exact matches: with the MiniLM (400 training, 300 held-out, one seed) the
sigmoids per step 0.157 / 0.847, a regression on the position 0.253 / 0.753,
a softmax over the points 0.253 / 0.770 (read as its median point 0.210 /
0.807); with the tiny model (600 / 400 reviews, 3 seeds) 0.299 / 0.717, the
regression 0.273 / 0.743, the softmax 0.388 / 0.672 (0.359 / 0.683). The
sigmoids per step won clearly where it matters, on a pretrained model, and
came close on the tiny one, and they give each point's probability as they
are. A 0-100 score, MAE: the squared error 5.87 (MiniLM) and 5.83 (tiny), the
absolute error 5.73 and 6.66, a softmax over 21 bins read as its expected
value 22.23 and 13.39.

Part of the remote half: importing this module loads only the standard
library; torch is passed in.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from potato.training.trainers.answers import SchemaAnswers, label_fields, most_probable, multilabel_fields, tune_thresholds



class Head:
    """Softmax over the schema's labels, trained with cross-entropy: the ``nominal`` head."""

    problem_type = "single_label_classification"

    def __init__(self, answers: SchemaAnswers):
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
        return self.answers.labels[most_probable(outputs)]

    def record(self, outputs: List[float], held_out: bool) -> Dict[str, Any]:
        """The prediction's fields beside ``id`` and ``schema``."""
        return label_fields(self.answers, outputs, held_out)

    def saved(self) -> Dict[str, Any]:
        """What ``labels.json`` records to read the saved model's outputs."""
        return {"kind": self.answers.kind}


class Sigmoids(Head):
    """One sigmoid per output, trained with binary cross-entropy (the subclass says what each output is)."""

    problem_type = "multi_label_classification"

    def targets(self, torch: Any, targets: List[Any]) -> Any:
        return torch.tensor(targets, dtype=torch.float32)

    def loss(self, torch: Any, logits: Any, y: Any) -> Any:
        # Mean over the outputs, sum over the rows: a row weighs as much as a nominal one.
        per_output = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none")
        return per_output.mean(dim=-1).sum()

    def activate(self, torch: Any, logits: Any) -> Any:
        return torch.sigmoid(logits)


class Multilabel(Sigmoids):
    """One sigmoid per label, binary cross-entropy, one threshold per label.

    Each label's threshold is the one that gives it the best F1 on the
    training items, after training on all of them. Measured on rated reviews
    (bench/answer_heads.py, five labels, one rare), against holding 20 % of the
    training items back from training to tune on, and against 0.5 everywhere
    — micro-F1, macro-F1, exact sets: the MiniLM (400 training, 300 held-out,
    one seed) 0.590 / 0.508 / 0.323, the held-back slice 0.557 / 0.530 / 0.283,
    0.5 0.563 / 0.461 / 0.310; the tiny model (600 / 400, 3 seeds) 0.616 /
    0.592 / 0.334, 0.583 / 0.562 / 0.263, 0.578 / 0.509 / 0.354. Held-back
    items cost the model a fifth of its data, which costs more than tuning on
    items it has seen. A model sure of every training item leaves a wide gap
    between their probabilities, and the middle of it is taken
    (:func:`tune_thresholds`): near 0.5, as if untuned, not on an item's
    edge. Tuning for the fewest wrong boxes instead of F1 kept the exact sets
    (0.323 and 0.357) and lost F1 (MiniLM 0.515 / 0.434): a rare label was
    then seldom ticked at all.
    """

    def __init__(self, answers: SchemaAnswers):
        super().__init__(answers)
        self.thresholds = [0.5] * len(answers.labels)

    def split(self, train: List[int], seed: int) -> Tuple[List[int], List[int]]:
        return train, list(train)

    def target(self, gold: Any) -> Any:
        chosen = set(gold)
        return [1.0 if label in chosen else 0.0 for label in self.answers.labels]

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
    """One output, a fraction of a scale (the subclass says of what), trained with the squared error."""

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


class Ordinal(Sigmoids):
    """One sigmoid per step of the scale: the probability that the answer lies above that point ("above 1",
    "above 2", "above 3", "above 4" for a 1-5 scale), trained with binary cross-entropy.

    Each output learns that an answer of 4 is above 1, 2 and 3, so the scale's
    order is in the targets, which a softmax over the points has to find out
    from the data (the module's numbers). The answer is the first point the
    model does not put it above; the outputs' differences are each point's
    probability (negative ones, where two outputs disagree, count as 0), its
    ``confidence`` and a held-out item's ``probs``.
    """

    @property
    def num_outputs(self) -> int:
        return len(self.answers.labels) - 1

    def id2label(self) -> Dict[int, str]:
        return {k: "above " + label for k, label in enumerate(self.answers.labels[:-1])}

    def target(self, gold: Any) -> Any:
        point = self.answers.index(gold)
        return [1.0 if point > k else 0.0 for k in range(self.num_outputs)]

    def _point(self, outputs: List[float]) -> int:
        return next((k for k, above in enumerate(outputs) if above < 0.5), len(outputs))

    def probabilities(self, outputs: List[float]) -> List[float]:
        above = [1.0] + list(outputs) + [0.0]
        probs = [max(0.0, above[k] - above[k + 1]) for k in range(len(outputs) + 1)]
        total = sum(probs)
        return [p / total for p in probs] if total > 0 else [1.0 / len(probs)] * len(probs)

    def answer(self, outputs: List[float]) -> Any:
        return self.answers.labels[self._point(outputs)]

    def record(self, outputs: List[float], held_out: bool) -> Dict[str, Any]:
        return label_fields(self.answers, self.probabilities(outputs), held_out, self._point(outputs))


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


# One head per kind hf-text-classification is declared to train (potato/training/trainers/registry.py).
HEADS = {"nominal": Head, "ordinal": Ordinal, "continuous": Continuous, "multilabel": Multilabel}


def make_head(answers: SchemaAnswers) -> Head:
    """The head for ``answers``' kind (one of ``HEADS``)."""
    return HEADS[answers.kind](answers)
