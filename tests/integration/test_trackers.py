"""Experiment trackers, real ones: a run reports to a real MLflow tracking server and to TensorBoard.

What MLflow holds is read back with MLflow's own client (in its own
virtualenv, tests/support/mlflow_server.py), TensorBoard's event file with
TensorBoard's own reader. The annotation server reports; the worker never
talks to a tracker.
"""

from __future__ import annotations

import json
import re

import pytest

from potato.config import load_config
from tests.support.mlflow_server import mlflow_server, read_back  # noqa: F401  (the session's MLflow server)
from tests.support.runs import free_port, potato, run_dir_of, store_of, tiny_project

pytestmark = [pytest.mark.prefect, pytest.mark.training]

SECRET = "s3cret-pass"


def test_a_run_reports_its_steps_scores_and_files_to_mlflow_and_tensorboard(prefect_api, mlflow_server, tmp_path,
                                                                              monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tiny_project(tmp_path, report_to=["mlflow", "tensorboard"])
    # Credentials in the address: sent as the request's Authorization, never shown (this server has no auth).
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.replace("http://", f"http://alice:{SECRET}@"))
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "sentiment-runs")
    done = potato("training", "run", str(config))
    assert done.returncode == 0, done.stdout + done.stderr
    run = store_of(config).get_run(1)
    log = (run_dir_of(config, 1) / "run.log").read_text()
    line = re.search(r"MLflow: run (\w+) of experiment 'sentiment-runs' at (\S+) \((\d+) metrics, (\d+) params, "
                     r"(\d+) files\)", log)
    assert line and line.group(2) == mlflow_server, log
    assert re.search(r"Reported to mlflow, tensorboard in \d+\.\d\d s", log), log

    [tracked] = read_back(mlflow_server, "sentiment-runs", "run-1", tmp_path / "downloaded")
    assert tracked["status"] == "FINISHED"
    assert (tracked["tags"]["potato.run_id"], tracked["tags"]["potato.project"]) == ("1", "Review Sentiment")
    params = tracked["params"]
    assert (params["trainer"], params["backend"], params["option/epochs"], params["data/items"]) == (
        "hf-text-classification", "local", "10", "60")
    assert params["data/sentiment/holdout"] == str(run.scores["sentiment"]["n"])
    assert tracked["metrics"]["holdout/sentiment/accuracy"] == run.scores["sentiment"]["accuracy"]
    assert {"holdout/sentiment/positive/f1", "holdout/sentiment/negative/f1"} <= set(tracked["metrics"])
    steps = [step for step, _ in tracked["history"]["train/loss"]]
    assert steps == sorted(steps) and len(steps) >= 2 and steps[0] > 0
    rates = [lr for _, lr in tracked["history"]["train/learning_rate"]]
    assert rates[0] > 0 and all(lr >= 0 for lr in rates)  # it decays to 0 at the last step
    assert all(rate > 0 for _, rate in tracked["history"]["train/examples_per_s"])
    assert tracked["files"] == ["evaluation.json", "pictures/sentiment-confusion.svg",
                                "pictures/sentiment-reliability.svg", "report.md", "scores.json"]
    downloaded = tmp_path / "downloaded"
    assert json.loads(next(downloaded.rglob("scores.json")).read_text()) == run.scores
    assert "<title>Confusion matrix of sentiment</title>" in next(downloaded.rglob("sentiment-confusion.svg")).read_text()
    assert int(line.group(3)) == sum(len(h) for h in tracked["history"].values())
    assert int(line.group(4)) == len(params) and int(line.group(5)) == 5

    # TensorBoard's own reader: the same steps and scores, the report as text.
    where = load_config(config).training_dir / "tensorboard" / "run-1"
    events = EventAccumulator(str(where), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"train/loss", "train/learning_rate", "holdout/sentiment/accuracy"} <= set(scalars)
    assert [e.step for e in events.Scalars("train/loss")] == steps
    assert events.Scalars("holdout/sentiment/accuracy")[0].value == pytest.approx(run.scores["sentiment"]["accuracy"])
    report = events.Tensors("report")[0].tensor_proto.string_val[0].decode()
    assert report.startswith("# Run 1 of Review Sentiment")
    assert f"tensorboard --logdir {where.parent}" in log

    # The password of the address is nowhere a person or Prefect could read it.
    training = config.parent / "annotation_output" / "training"
    for path in [training / "runs.db", *training.rglob("*.log"), *training.rglob("*.json"), *training.rglob("*.md")]:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in done.stdout + done.stderr


def test_a_tracker_that_is_down_is_a_warning_and_the_run_succeeds(prefect_api, tmp_path, monkeypatch):
    config = tiny_project(tmp_path, report_to=["mlflow"], trainer={"epochs": 2})
    down = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", down)
    done = potato("training", "run", str(config))
    assert done.returncode == 0, done.stdout + done.stderr
    assert store_of(config).get_run(1).state == "succeeded"
    log = (run_dir_of(config, 1) / "run.log").read_text()
    assert re.search(rf"WARNING Not reported to mlflow: the MLflow tracking server at {re.escape(down)} did not "
                     r"answer \(\[Errno 111\] Connection refused\); is it running, and is MLFLOW_TRACKING_URI its "
                     r"address\?; the run is not affected", log), log
