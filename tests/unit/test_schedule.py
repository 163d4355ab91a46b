"""How long a fine-tune trains and which epoch it keeps (potato/training/trainers/schedule.py): the pure parts."""

from __future__ import annotations

import pytest

from potato.training.trainers import schedule
from potato.training.trainers.schedule import BestEpoch, Validation, describe_plan, make_plan, share_epochs, split_validation


def test_without_epochs_the_floor_on_steps_decides_and_a_user_s_epochs_win():
    few = make_plan(56, 16, 1, {"epochs": None}, validating=True)
    assert (few.epochs, few.steps_per_epoch, few.total_steps) == (60, 4, 240)  # 75 epochs to 300: capped
    assert few.chosen and few.patience == 6  # a tenth of 60
    many = make_plan(8000, 16, 1, {}, validating=True)
    assert (many.epochs, many.steps_per_epoch, many.patience) == (3, 500, 5)  # 1500 steps: the minimum epochs
    middle = make_plan(400, 16, 2, {"min_steps": 100}, validating=False)
    assert (middle.epochs, middle.steps_per_epoch, middle.patience) == (8, 13, None)  # 25 batches, 2 a step
    asked = make_plan(56, 16, 1, {"epochs": 3}, validating=False)
    assert (asked.epochs, asked.chosen, asked.patience) == (3, False, None)
    assert describe_plan(46, 10, few, {}) == "46 training items, 10 for validation: 60 epochs (at least 300 steps)"
    assert describe_plan(56, 0, asked, {"epochs": 3}) == "56 training items: 3 epochs (as the options ask)"
    assert describe_plan(66, 0, few, {}) == ("66 training items (too few to hold out a validation share: all of them "
                                             "train, the last epoch is kept): 60 epochs (at least 300 steps)")


def test_the_learning_rate_warms_up_then_falls_to_zero():
    plan = make_plan(160, 16, 1, {"epochs": 2, "warmup": 0.1}, validating=False)  # 20 steps, 2 of warm-up
    factors = [plan.learning_rate_factor(step) for step in range(plan.total_steps)]
    assert factors[:3] == [0.5, 1.0, 1.0] and factors[-1] == pytest.approx(1 / 18)
    assert all(a >= b for a, b in zip(factors[1:], factors[2:]))
    no_warmup = make_plan(160, 16, 1, {"epochs": 2, "warmup": 0}, validating=False)
    assert no_warmup.learning_rate_factor(0) == 1.0


def test_the_validation_share_is_seeded_spread_over_labels_and_left_out_when_too_small():
    train = list(range(1000))
    label = {i: "rare" if i % 100 == 0 else "common" for i in train}
    fit, held = split_validation(train, {"seed": 1}, label.get)
    assert len(held) == 150 and sorted(fit + held) == train and not set(fit) & set(held)
    assert sum(label[i] == "rare" for i in held) == 2  # 15 % of the 10 rare items, rounded
    assert split_validation(train, {"seed": 1}, label.get) == (fit, held)  # the same in every process
    assert split_validation(train, {"seed": 2}, label.get)[1] != held
    assert split_validation(train, {"epochs": 5}) == (train, [])  # a user's epochs: every item trains
    assert len(split_validation(train, {"epochs": 5, "validation_share": 0.2})[1]) == 200
    assert len(split_validation(list(range(10_000)), {})[1]) == schedule.MAX_VALIDATION


def test_the_default_share_is_held_out_only_from_a_hundred_items_and_a_share_asked_for_from_eight():
    assert len(split_validation(list(range(664)), {})[1]) == 100  # 99.6, rounded
    assert split_validation(list(range(663)), {}) == (list(range(663)), [])  # 99.45: every item trains
    assert len(split_validation(list(range(100)), {"validation_share": 0.15})[1]) == 15
    assert split_validation(list(range(40)), {"validation_share": 0.15}) == (list(range(40)), [])  # 6: noise


class _Param:
    def __init__(self, value: float, requires_grad: bool = True):
        self.value, self.requires_grad = value, requires_grad

    def detach(self):
        return self

    def to(self, device, copy=False):
        return _Param(self.value, self.requires_grad)

    @property
    def data(self):
        return self

    def copy_(self, other):
        self.value = other.value


class _Model:
    def __init__(self):
        self.params = {"head": _Param(0.0), "frozen": _Param(9.0, requires_grad=False)}

    def named_parameters(self):
        return iter(self.params.items())


def test_the_best_epoch_is_kept_and_patience_counts_epochs_since_the_score_rose():
    plan = make_plan(56, 16, 1, {"patience": 2}, validating=True)
    best, model = BestEpoch(plan, "span F1"), _Model()
    seen = [(0.50, 0.9), (0.80, 0.7), (0.80, 0.5), (0.80, 0.6), (0.70, 0.4)]
    stops = []
    for epoch, (score, loss) in enumerate(seen, 1):
        model.params["head"].value = float(epoch)
        stops.append(best.update(epoch, Validation(score, loss, score), model))
    # Epoch 3's lower loss at the same score is kept, but the score last rose at epoch 2: patience 2 ends at 4.
    assert stops == [False, False, False, True, True]
    assert best.epoch == 3
    best.restore(model)
    assert model.params["head"].value == 3.0 and model.params["frozen"].value == 9.0
    assert best.describe() == "stopped at epoch 5, best validation span F1 0.800 at epoch 3"


def test_a_learning_curve_s_shares_train_no_longer_than_the_whole_run_did():
    whole = make_plan(200, 16, 1, {}, validating=True)  # 13 steps an epoch: 24 epochs planned for 300 steps
    fit = BestEpoch(whole, "accuracy")
    for epoch in range(1, whole.epochs + 1):
        if fit.update(epoch, Validation(0.6 if epoch == 1 else 0.7, 0.5, 0.7), _Model()):
            break
    assert (whole.epochs, whole.patience, fit.last_epoch) == (24, 5, 7)  # the score last rose at epoch 2
    assert share_epochs(whole, fit) == 7
    shares = [make_plan(n, 16, 1, {}, validating=True, most_epochs=share_epochs(whole, fit)) for n in (50, 100, 150)]
    assert [p.epochs for p in shares] == [7, 7, 7]  # the floor on steps alone would say 60, 43 and 30
    steps = sum(p.total_steps for p in shares)
    assert steps == 7 * (4 + 7 + 10) and steps <= 1.7 * 7 * whole.steps_per_epoch
    # No validation share (nothing stopped early), or no run yet: the whole run's plan.
    assert share_epochs(whole, BestEpoch(whole, "accuracy")) == 24 and share_epochs(None, None) is None
    asked = make_plan(50, 16, 1, {"epochs": 3}, validating=True, most_epochs=8)
    assert asked.epochs == 3  # a user's epochs win


def test_an_error_metric_is_shown_as_it_is_and_compared_the_right_way_round():
    plan = make_plan(56, 16, 1, {"epochs": 2, "validation_share": 0.2}, validating=True)
    best, model = BestEpoch(plan, "MAE"), _Model()
    best.update(1, Validation(-0.40, 1.0, 0.40), model)
    best.update(2, Validation(-0.30, 1.0, 0.30), model)
    assert best.describe() == "trained all 2 epochs, best validation MAE 0.300 at epoch 2"


def test_bad_schedule_options_are_named():
    assert schedule.schedule_problems({"epochs": 0, "min_steps": True, "patience": 1.5, "validation_share": 0.9,
                                       "warmup": 1}) == [
        "epochs must be a positive integer, got 0",
        "min_steps must be a positive integer, got True",
        "patience must be a positive integer, got 1.5",
        "validation_share must be a number from 0 to 0.5, got 0.9",
        "warmup must be a number from 0 to below 1, got 1",
    ]
    assert schedule.schedule_problems(dict(schedule.SCHEDULE_OPTIONS)) == []
