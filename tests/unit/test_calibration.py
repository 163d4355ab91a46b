"""Calibration measures, fits and the keep-or-back-out guard (pure Python, no model)."""

from __future__ import annotations

import pytest

from potato.training import calibration as cal
from potato.training.trainers.decision_calibrate import DEFAULT_OPTIONS, calibrate_schema, check_options, describe


def _rows(confidences, correct):
    return [{"confidence": c, "correct": ok, "gold_prob": c if ok else 1 - c} for c, ok in zip(confidences, correct)]


def _overconfident(n):
    # Says 0.97-0.99 on everything, right three times in four.
    return [0.97 + 0.02 * (i % 3) / 2 for i in range(n)], [i % 4 != 0 for i in range(n)]


def test_reliability_bins_and_ece():
    bins = cal.reliability_bins([0.95, 0.95, 0.55, 0.05], [True, False, True, True], bins=10)
    assert [b["n"] for b in bins] == [1, 0, 0, 0, 0, 1, 0, 0, 0, 2]
    assert bins[9] == {"lo": 0.9, "hi": 1.0, "n": 2, "confidence": 0.95, "accuracy": 0.5}
    assert cal.expected_calibration_error([0.95, 0.95, 0.55, 0.05], [True, False, True, True]) == \
        pytest.approx((2 * 0.45 + 1 * 0.45 + 1 * 0.95) / 4)
    assert cal.expected_calibration_error([], []) is None


def test_threshold_for_precision_is_the_lowest_that_holds():
    conf = [0.99, 0.95, 0.9, 0.8, 0.7, 0.6]
    right = [True, True, True, True, False, False]
    assert cal.threshold_for_precision(conf, right, 0.9) == (0.8, 4 / 6)
    assert cal.threshold_for_precision(conf, [False] * 6, 0.9) == (None, 0.0)


@pytest.mark.parametrize("method, n", [("temperature", 400), ("platt", 60)])
def test_overconfident_holdout_is_calibrated_and_kept(method, n):
    assert cal.choose_method(n) == method
    conf, right = _overconfident(n)
    result = calibrate_schema(_rows(conf, right), 2, dict(DEFAULT_OPTIONS))
    assert result["kept"] is True and result["method"] == method
    assert result["ece_after"] < result["ece_before"] and result["log_loss_after"] < result["log_loss_before"]
    mapping = cal.CalibrationMap(result["map"]["a"], result["map"]["b"])
    assert 0.65 < mapping(0.98) < 0.85  # about the three in four it gets right
    if method == "temperature":
        assert result["map"]["temperature"] > 1  # over-confidence is cooled
    line = describe("sentiment", result, 0.9)
    assert line.startswith("Schema 'sentiment': calibration kept (") and "it lowered holdout log-loss" in line


def test_a_calibrated_model_is_left_alone():
    # Confidence 0.8, right exactly four in five: ECE 0 cannot be lowered.
    conf, right = [0.8] * 100, [i % 5 != 0 for i in range(100)]
    result = calibrate_schema(_rows(conf, right), 2, dict(DEFAULT_OPTIONS))
    assert result["kept"] is False and result["ece_before"] == 0.0
    assert "it did not lower holdout" in result["reason"] and "ECE" in result["reason"]
    assert result["map"] == {"method": "none", "a": 1.0, "b": 0.0, "temperature": 1.0}


def test_a_tiny_holdout_backs_out():
    conf, right = _overconfident(6)
    result = calibrate_schema(_rows(conf, right), 2, dict(DEFAULT_OPTIONS))
    assert result["kept"] is False
    assert result["reason"] == ("only 6 held-out item(s); at least 10 are needed to judge a calibration, so the "
                                "confidences stay as they are")
    assert describe("sentiment", result, 0.9).startswith("Schema 'sentiment': calibration backed out (platt, 6 ")


def test_options_are_checked():
    assert check_options({"run": 3, "method": "platt", "bins": 15, "folds": 3, "target_precision": 0.95}) == []
    assert check_options({"run": 0, "method": "isotonic", "bins": 1, "target_precision": 1.5, "x": 1}) == [
        "'x' is not an option of decision-calibrate; valid options: bins, folds, method, run, target_precision",
        "run must be a run id (a positive integer), got 0",
        "method must be auto, temperature or platt, got 'isotonic'",
        "bins must be an integer from 2 to 100, got 1",
        "target_precision must be a number between 0 and 1, got 1.5",
    ]
