"""How long a fine-tune trains, and which of its epochs it keeps: defaults that fit the data a project has.

A fixed number of epochs fits one size of data only. Three epochs of the 66
items a span project has in its first days are 15 optimizer steps, and the
tagger they make predicts no span at all; three epochs of a few hundred news
stories left a full fine-tune below logistic regression on the frozen
encoder it started from. So unless ``epochs`` is set:

- **A floor on steps, not a count of epochs.** As many epochs as it takes to
  make ``min_steps`` optimizer steps (at least ``MIN_EPOCHS``, at most
  ``MAX_EPOCHS``): many epochs of a small set, few of a large one.
- **A validation share** of the training items (``validation_share``; at
  most ``MAX_VALIDATION`` items), never trained on, scored after every epoch
  with the schema's own metric (its loss breaks ties). The weights of the
  best epoch are the ones kept, and training stops once ``patience`` epochs
  have passed without a better score. The default share is held out only
  once it holds ``MIN_DEFAULT_VALIDATION`` items (from 664 training items
  on); a share the options ask for, once it holds ``MIN_VALIDATION``.
  Without one, every item trains for the planned epochs and the last is
  kept: a choice made on a few dozen items is noise, and it costs the
  labels it holds out. On SST-2 (random draws, three seeds, the GLUE dev
  set), training every item instead of holding out 15 %::

      labels  held out 15 %, best epoch   every item, planned epochs
         300  0.758 (sd 0.022)            0.775 (sd 0.003)
         500  0.779 (sd 0.009)            0.793 (sd 0.015)

  With a patience of 60 (no early stop) the held-out runs kept the same
  epochs, so it is the choice and the lost labels that cost, not stopping.
- **Warm-up** (``warmup``): the learning rate rises over the first share of
  the steps, then falls linearly to 0 (transformers' ``linear`` schedule with
  warm-up), which keeps the first steps of a fresh head from wrecking the
  pretrained weights under it.

A user's ``epochs`` wins: exactly that many are trained and the last kept, on
every training item (no validation share unless ``validation_share`` is set
too). The learning rate's defaults (full fine-tune against LoRA) are the
trainers' own (``potato.training.trainers.hf_common``, ``hf_llm_finetune``).

The run log says what was chosen and why, and how it ended::

    Schema 'entities': 66 training items (too few to hold out a validation share: all of them train, the last
    epoch is kept): 60 epochs (at least 300 steps), trained all 60 epochs
    Schema 'label': 2040 training items, 360 for validation: 3 epochs (at least 300 steps), trained all 3
    epochs, best validation accuracy 0.912 at epoch 2

The numbers were measured with bench/small_data.py on SST-2 and on generated
projects of every kind (its docstring has the tables).

Part of the remote half: standard library only, Python 3.8.
"""

import math
import random
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from potato.training.trainers.options import is_int, is_number

# The floor on optimizer steps when epochs is not set.
MIN_STEPS = 300
MIN_EPOCHS = 3
MAX_EPOCHS = 60
# The share of the training items held out of training to choose the epoch, when epochs is not set.
VALIDATION_SHARE = 0.15
MIN_VALIDATION = 8    # fewer than this many: no validation share, even one the options ask for
MIN_DEFAULT_VALIDATION = 100  # fewer than this many: the default share is not held out (see the docstring)
MAX_VALIDATION = 400  # a large project's validation pass costs no more than this many items' prediction
# Epochs without a better validation score before training stops: at least this many, or this share of the plan.
PATIENCE = 5
PATIENCE_SHARE = 0.1
WARMUP = 0.1

# The options every fine-tuning trainer takes for this, with their defaults (None: decided from the data).
SCHEDULE_OPTIONS = {
    "epochs": None,
    "min_steps": MIN_STEPS,
    "validation_share": None,  # None: VALIDATION_SHARE when epochs is not set, else 0
    "patience": None,          # None: PATIENCE or PATIENCE_SHARE of the planned epochs, the larger
    "warmup": WARMUP,
    "curve": False,            # true: a learning curve too (potato.training.trainers.learning_curve)
}  # type: Dict[str, Any]


def schedule_problems(options: Dict[str, Any]) -> List[str]:
    """What is wrong with the schedule's options, each naming its key."""
    problems = []
    for key in ("epochs", "min_steps", "patience"):
        value = options.get(key)
        if value is not None and not (is_int(value) and value > 0):
            problems.append("{} must be a positive integer, got {!r}".format(key, value))
    share = options.get("validation_share")
    if share is not None and not (is_number(share) and 0 <= share <= 0.5):
        problems.append("validation_share must be a number from 0 to 0.5, got {!r}".format(share))
    warmup = options.get("warmup")
    if warmup is not None and not (is_number(warmup) and 0 <= warmup < 1):
        problems.append("warmup must be a number from 0 to below 1, got {!r}".format(warmup))
    if "curve" in options and not isinstance(options["curve"], bool):
        problems.append("curve must be true or false, got {!r}".format(options["curve"]))
    return problems


class Schedule(NamedTuple):
    """How one schema's model trains: epochs, steps, warm-up, and the patience of early stopping."""

    epochs: int
    steps_per_epoch: int
    warmup_steps: int
    patience: Optional[int]  # None: no early stopping (no validation share)
    chosen: bool             # True: epochs came from the data (the floor on steps), not the options

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def learning_rate_factor(self, step: int) -> float:
        """The share of the learning rate at optimizer step ``step`` (0-based): linear warm-up, then
        linear decay to 0 at the last step."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        rest = self.total_steps - self.warmup_steps
        return max(0.0, (self.total_steps - step) / rest) if rest > 0 else 0.0


def validation_share(options: Dict[str, Any]) -> float:
    """The share of training items to validate on: the option, else VALIDATION_SHARE unless epochs is set."""
    share = options.get("validation_share")
    if share is not None:
        return float(share)
    return 0.0 if options.get("epochs") else VALIDATION_SHARE


def least_validation(options: Dict[str, Any]) -> int:
    """The fewest items a validation share holds: with fewer, every item trains instead."""
    return MIN_VALIDATION if options.get("validation_share") is not None else MIN_DEFAULT_VALIDATION


def split_validation(train: Sequence[int], options: Dict[str, Any],
                     group_of: Optional[Callable[[int], Any]] = None) -> Tuple[List[int], List[int]]:
    """``(items to train on, items to validate on)`` of the training positions ``train``.

    Seeded by the run's ``seed``, so every process of a data-parallel run and
    every rerun draws the same items. ``group_of(i)`` (an item's label, for a
    one-label schema) spreads the validation items over the groups in
    proportion, so a rare label is not left out of it by chance. No
    validation share below ``least_validation(options)`` items.
    """
    share = validation_share(options)
    size = min(MAX_VALIDATION, int(round(share * len(train))))
    if share <= 0 or size < least_validation(options) or len(train) - size < MIN_VALIDATION:
        return list(train), []
    rng = random.Random(options.get("seed", 0))
    groups = {}  # type: Dict[Any, List[int]]
    for i in train:
        groups.setdefault(group_of(i) if group_of else None, []).append(i)
    keys = sorted(groups, key=repr)
    quotas = {key: size * len(groups[key]) / len(train) for key in keys}
    counts = {key: int(quotas[key]) for key in keys}
    # The items left over go to the groups whose quotas were cut the most, the smaller first: exactly size in all.
    for key in sorted(keys, key=lambda k: (counts[k] - quotas[k], len(groups[k])))[:size - sum(counts.values())]:
        counts[key] += 1
    chosen = []  # type: List[int]
    for key in keys:
        members = groups[key]
        rng.shuffle(members)
        chosen += members[:counts[key]]
    held = set(chosen)
    return [i for i in train if i not in held], sorted(held)


def make_plan(examples: int, batch_size: int, accumulate: int, options: Dict[str, Any], validating: bool,
              most_epochs: Optional[int] = None) -> Schedule:
    """The plan for ``examples`` training examples in batches of ``batch_size``, ``accumulate`` batches a step;
    ``most_epochs`` caps the epochs the floor on steps would choose (a learning curve's smaller shares)."""
    batches = max(1, (examples + batch_size - 1) // batch_size)
    steps_per_epoch = (batches + accumulate - 1) // accumulate
    epochs = options.get("epochs")
    chosen = not epochs
    if chosen:
        floor = options.get("min_steps") or MIN_STEPS
        epochs = min(most_epochs or MAX_EPOCHS, MAX_EPOCHS, max(MIN_EPOCHS, int(math.ceil(floor / steps_per_epoch))))
    warmup = options.get("warmup")
    warmup_steps = int(round((WARMUP if warmup is None else warmup) * epochs * steps_per_epoch))
    patience = None
    if validating:
        patience = options.get("patience") or max(PATIENCE, int(math.ceil(PATIENCE_SHARE * epochs)))
    return Schedule(epochs, steps_per_epoch, warmup_steps, patience, chosen)


class Validation(NamedTuple):
    """One epoch's validation: the schema's metric as a number where higher is better (an error's negative),
    the mean loss, and the metric as it is shown."""

    score: float
    loss: float
    value: float


class BestEpoch:
    """The best epoch so far by validation score (loss breaking ties), its weights kept on the CPU.

    ``update`` copies the trainable weights of a better epoch (all of a full
    fine-tune, the adapter of a LoRA); ``restore(model)`` puts the best back.
    Patience counts epochs since the score last rose: a lower loss at the same
    score chooses which epoch is kept, but does not keep training going (on an
    easy task the score tops out early while the loss falls for a long time).
    """

    def __init__(self, plan: Schedule, metric: str):
        self.plan, self.metric = plan, metric
        self.epoch = -1
        self.best = None  # type: Optional[Validation]
        self.last_epoch = 0
        self._rose = 0  # the epoch the score last rose
        self._state = None  # type: Optional[Dict[str, Any]]

    def update(self, epoch: int, seen: Validation, model: Any) -> bool:
        """Record epoch ``epoch``'s validation; returns True when training should stop (patience spent)."""
        self.last_epoch = epoch
        rose = self.best is None or seen.score > self.best.score + 1e-9
        if rose or (abs(seen.score - self.best.score) <= 1e-9 and seen.loss < self.best.loss - 1e-9):
            self.epoch, self.best = epoch, seen
            # The trained weights only: a LoRA's adapter, not the (4-bit) base under it.
            self._state = {name: p.detach().to("cpu", copy=True)
                           for name, p in model.named_parameters() if p.requires_grad}
        if rose:
            self._rose = epoch
        return self.plan.patience is not None and epoch - self._rose >= self.plan.patience

    def restore(self, model: Any) -> None:
        if self._state is not None:
            params = dict(model.named_parameters())
            for name, saved in self._state.items():
                params[name].data.copy_(saved)

    def describe(self) -> str:
        """``stopped at epoch 23, best validation span F1 0.910 at epoch 17`` (or ``… after all 40 epochs``)."""
        end = ("stopped at epoch {}".format(self.last_epoch) if self.last_epoch < self.plan.epochs
               else "trained all {} epochs".format(self.plan.epochs))
        if self.best is None:
            return end
        at = "at epoch {}".format(self.epoch) if self.epoch else "before fine-tuning (the linear probe)"
        return "{}, best validation {} {:.3f} {}".format(end, self.metric, self.best.value, at)


def share_epochs(plan: Optional[Schedule], fit: Optional[BestEpoch]) -> Optional[int]:
    """The most epochs a learning curve's share trains: as many as the schema's whole run (``plan``, how it
    went: ``fit``) trained before it stopped, not the epochs it planned. A share has fewer steps an epoch, so
    the floor on steps alone would train it longer than the whole run; capped, the three shares (25, 50 and
    75 %) take about 1.5 times the whole run's steps."""
    if plan is None:
        return None
    if fit is not None and fit.last_epoch:
        return fit.last_epoch
    return plan.epochs


def describe_plan(items: int, validation: int, plan: Schedule, options: Dict[str, Any]) -> str:
    """``700 training items, 105 for validation: 7 epochs (at least 300 steps)``: what was chosen, and why."""
    text = "{} training item{}".format(items, "" if items == 1 else "s")
    if validation:
        text += ", {} for validation".format(validation)
    elif validation_share(options) > 0:
        text += " (too few to hold out a validation share: all of them train, the last epoch is kept)"
    if plan.chosen:
        return "{}: {} epochs (at least {} steps)".format(text, plan.epochs, options.get("min_steps") or MIN_STEPS)
    return "{}: {} epochs (as the options ask)".format(text, plan.epochs)
