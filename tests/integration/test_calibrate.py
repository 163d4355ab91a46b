"""decision-calibrate through the real CLI, flow, Prefect API and worker, after a real (tiny) training run.

The labels are deliberately noisy (one item in four labelled against what
its text says), and the tiny BERT trains long enough to be sure of itself:
on the holdout it says ~0.99 and is right about three times in four.
"""

from __future__ import annotations

import json

import pytest

from tests.support.runs import noisy_tiny_project, potato, run_dir_of, store_of, tiny_project

pytestmark = [pytest.mark.prefect, pytest.mark.training]


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_calibration_lowers_ece_of_an_overconfident_model_and_rewrites_its_predictions(prefect_api, tmp_path):
    config = noisy_tiny_project(tmp_path, n_items=240, holdout_fraction=0.35)
    trained = potato("training", "run", str(config))
    assert trained.returncode == 0, trained.stdout + trained.stderr
    source = run_dir_of(config, 1)
    evaluation = json.loads((source / "evaluation.json").read_text())["schemas"]["sentiment"]
    assert evaluation["ece"] > 0.1  # over-confident, as built
    holdout = [r for r in _jsonl(source / "labels.jsonl") if r["holdout"]]
    assert len(holdout) == evaluation["n"] and all(len(r["probs"]) == 2 for r in holdout)
    writeback = config.parent / "annotation_output/training/predictions.jsonl"
    before = {r["id"]: r["predictions"]["sentiment"] for r in _jsonl(writeback)}
    original = (source / "predictions.jsonl").read_text()

    done = potato("training", "run", str(config), "--trainer", "decision-calibrate")
    assert done.returncode == 0, done.stdout + done.stderr
    run = store_of(config).get_run(2)
    scores = run.scores["sentiment"]
    assert (run.state, run.backend, scores["kept"], scores["calibrated_run"]) == ("succeeded", "local", True, 1)
    assert scores["ece_after"] < scores["ece_before"] and scores["log_loss_after"] < scores["log_loss_before"]
    log = (run_dir_of(config, 2) / "run.log").read_text()
    assert "Calibrating run 1 (hf-text-classification, finished " in log
    assert "Schema 'sentiment': calibration kept (" in log and "it lowered holdout log-loss" in log
    assert "Run 1's predictions of sentiment now carry calibrated confidences" in log

    # The run's predictions are rewritten; the worker's original is kept beside them.
    assert (source / "predictions.uncalibrated.jsonl").read_text() == original
    rewritten = {(r["id"], r["schema"]): r for r in _jsonl(source / "predictions.jsonl")}
    originals = {(r["id"], r["schema"]): r for r in _jsonl(source / "predictions.uncalibrated.jsonl")}
    assert rewritten.keys() == originals.keys()
    assert all(rewritten[k]["label"] == originals[k]["label"] for k in rewritten)
    # On the held-out items the rewritten confidences are what was fitted: their mean moves towards the
    # model's accuracy there (an over-confident model's mean confidence comes down).
    gold = {(r["id"], "sentiment"): r["gold"] for r in holdout}
    accuracy = sum(originals[k]["label"] == g for k, g in gold.items()) / len(gold)
    mean_before = sum(originals[k]["confidence"] for k in gold) / len(gold)
    mean_after = sum(rewritten[k]["confidence"] for k in gold) / len(gold)
    assert mean_after < mean_before and abs(mean_after - accuracy) < abs(mean_before - accuracy), (
        accuracy, mean_before, mean_after)
    # The writeback: run 1's predictions, with the calibrated confidences, min_confidence applied anew.
    after = {r["id"]: r["predictions"]["sentiment"] for r in _jsonl(writeback)}
    assert after and all(p["run_id"] == 1 for p in after.values())
    assert all(p["confidence"] == rewritten[(item, "sentiment")]["confidence"] >= 0.5 for item, p in after.items())
    trained_on = {r["id"] for r in _jsonl(source / "labels.jsonl") if not r["holdout"]}
    assert not trained_on & (after.keys() | before.keys())  # the leak guard held, before and after
    calibration = json.loads((source / "evaluation.json").read_text())["schemas"]["sentiment"]["calibration"]
    assert calibration["by_run"] == 2 and calibration["kept"] and calibration["reliability_after"]
    assert json.loads((run_dir_of(config, 2) / "evaluation.json").read_text())["schemas"]["sentiment"][
        "calibration"] == calibration


def test_calibration_backs_out_on_a_tiny_holdout_and_changes_nothing(prefect_api, tmp_path):
    config = noisy_tiny_project(tmp_path, n_items=40, holdout_fraction=0.15)
    assert potato("training", "run", str(config)).returncode == 0
    source = run_dir_of(config, 1)
    writeback = config.parent / "annotation_output/training/predictions.jsonl"
    predictions, written = (source / "predictions.jsonl").read_text(), writeback.read_text()

    done = potato("training", "run", str(config), "--trainer", "decision-calibrate")
    assert done.returncode == 0, done.stdout + done.stderr
    scores = store_of(config).get_run(2).scores["sentiment"]
    assert scores["kept"] is False and scores["n"] < 10
    log = (run_dir_of(config, 2) / "run.log").read_text()
    assert (f"Schema 'sentiment': calibration backed out (platt, {scores['n']} held-out items): only "
            f"{scores['n']} held-out item(s); at least 10 are needed to judge a calibration") in log
    assert "Nothing was calibrated: run 1's predictions and the writeback stay as they were" in log
    assert (source / "predictions.jsonl").read_text() == predictions and writeback.read_text() == written
    assert not (source / "predictions.uncalibrated.jsonl").exists()


def test_calibration_without_a_trained_run_fails_saying_so(prefect_api, tmp_path):
    config = tiny_project(tmp_path, n_items=10)
    done = potato("training", "run", str(config), "--trainer", "decision-calibrate")
    assert done.returncode == 1
    assert ("Run 1 failed: decision-calibrate needs a succeeded training run of sentiment to calibrate, and "
            "there is none yet: train one first") in done.stdout
