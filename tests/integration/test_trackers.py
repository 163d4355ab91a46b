"""Experiment trackers, real ones: a run reports to a real MLflow tracking server, TensorBoard and W&B offline.

What MLflow holds is read back with MLflow's own client (in its own
virtualenv, tests/support/mlflow_server.py), TensorBoard's event file with
TensorBoard's own reader, W&B's offline run with W&B's own ``wandb leet
inspect`` and record protobuf (tests/support/wandb_records.py). The
annotation server reports; the worker never talks to a tracker.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from potato.config import load_config
from tests.support.mlflow_server import mlflow_server, read_back  # noqa: F401  (the session's MLflow server)
from tests.support.runs import free_port, potato, run_dir_of, store_of, tiny_project
from tests.support.wandb_records import read_offline_run

pytestmark = [pytest.mark.prefect, pytest.mark.training]

SECRET = "s3cret-pass"


def test_a_run_reports_its_steps_scores_and_files_to_mlflow_tensorboard_and_wandb(prefect_api, mlflow_server,
                                                                                    tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tiny_project(tmp_path, report_to=["mlflow", "tensorboard", "wandb"])
    # Credentials in the address: sent as the request's Authorization, never shown (this server has no auth).
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.replace("http://", f"http://alice:{SECRET}@"))
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "sentiment-runs")
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "1")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "sentiment-wandb")
    monkeypatch.setenv("WANDB_LOG_MODEL", "end")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # W&B stages an artifact's files in its user's home
    done = potato("training", "run", str(config))
    assert done.returncode == 0, done.stdout + done.stderr
    run = store_of(config).get_run(1)
    log = (run_dir_of(config, 1) / "run.log").read_text()
    line = re.search(r"MLflow: run (\w+) of experiment 'sentiment-runs' at (\S+) \((\d+) metrics, (\d+) params, "
                     r"(\d+) files\)", log)
    assert line and line.group(2) == mlflow_server, log
    assert re.search(r"Reported to mlflow, tensorboard, wandb in \d+\.\d\d s", log), log
    model_files = sorted(f"model/{p.relative_to(run_dir_of(config, 1) / 'artifacts').as_posix()}"
                         for p in (run_dir_of(config, 1) / "artifacts").rglob("*") if p.is_file())
    assert "model/sentiment/labels.json" in model_files

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
    assert tracked["files"] == sorted(["evaluation.json", "pictures/sentiment-confusion.svg",
                                       "pictures/sentiment-reliability.svg", "report.md", "scores.json",
                                       *model_files])
    downloaded = tmp_path / "downloaded"
    assert json.loads(next(downloaded.rglob("scores.json")).read_text()) == run.scores
    assert "<title>Confusion matrix of sentiment</title>" in next(downloaded.rglob("sentiment-confusion.svg")).read_text()
    assert int(line.group(3)) == sum(len(h) for h in tracked["history"].values())
    assert int(line.group(4)) == len(params) and int(line.group(5)) == 5 + len(model_files)

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

    # W&B's own reader of its offline run: the same steps, scores, params and files, and the model asked for.
    wandb_line = re.search(r"W&B: offline run run-1 of project 'sentiment-wandb' in (\S+) \(wandb sync (\S+)\)", log)
    assert wandb_line and wandb_line.group(1) == wandb_line.group(2), log
    offline = Path(wandb_line.group(1))
    assert offline.parent == load_config(config).training_dir / "wandb"
    wandb_run = read_offline_run(offline)
    assert (wandb_run.name, wandb_run.project, wandb_run.exit_code) == ("run-1", "sentiment-wandb", 0)
    assert wandb_run.config["option/epochs"] == "10" and wandb_run.config["potato/run_id"] == 1
    assert [step for step, _ in wandb_run.history["train/loss"]] == steps
    assert wandb_run.summary["holdout/sentiment/accuracy"] == run.scores["sentiment"]["accuracy"]
    assert set(wandb_run.files) == {"evaluation.json", "pictures/sentiment-confusion.svg",
                                    "pictures/sentiment-reliability.svg", "report.md", "scores.json"}
    assert json.loads((offline / "files" / "scores.json").read_text()) == run.scores
    assert wandb_run.artifacts["model-run-1"] == ("model", [name[len("model/"):] for name in model_files])

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


def _tracked(**fields):
    from potato.trackers.tracked_run import TrackedRun

    return TrackedRun(run_id=4, name="run-4", project="Two Schemas", started_at=1_800_000_000.0, **fields)


class _Config:
    def __init__(self, training_dir):
        self.training_dir = training_dir


def test_wandb_offline_keeps_each_schema_on_its_own_steps_and_its_files_inside_the_run(tmp_path, monkeypatch):
    from potato.trackers import weights_biases
    from potato.trackers.tracked_run import Step

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run = _tracked(
        params={"trainer": "hf-text-classification + hf-span-tagging", "option/label": "caf\ud800"},
        steps=[Step(5, 1_800_000_001.0, {"sentiment/train/loss": 0.7}), Step(10, 1_800_000_002.0,
                                                                               {"sentiment/train/loss": 0.5}),
               Step(3, 1_800_000_003.0, {"entities/train/loss": 2.0})],  # the second schema starts again at 1
        scores={"holdout/sentiment/accuracy": 0.75},
        curve=[("learning_curve/sentiment/accuracy", 12, 0.6), ("learning_curve/sentiment/accuracy", 24, 0.75)],
        files={"scores.json": b"{}", "pictures/../../../escaped.svg": b"<svg/>", "pictures/a b\u00e9.svg": b"<svg/>"})
    line = weights_biases.report(run, _Config(tmp_path / "training"), {"WANDB_MODE": "offline"})
    offline = Path(re.search(r"in (\S+) \(wandb sync", line).group(1))
    assert offline.parent == tmp_path / "training" / "wandb"
    read = read_offline_run(offline)
    assert read.history == {"sentiment/train/loss": [(5, 0.7), (10, 0.5)], "entities/train/loss": [(3, 2.0)]}
    assert read.config["option/label"] == "caf\\ud800"  # a lone surrogate (a label may hold one) as its escape
    assert sorted(read.files) == sorted(["pictures/a_b_.svg", "pictures/escaped.svg", "scores.json",
                                         read.tables["learning_curve/sentiment/accuracy"]])
    assert not (tmp_path / "escaped.svg").exists() and not (tmp_path / "training" / "escaped.svg").exists()
    table = json.loads((offline / "files" / read.tables["learning_curve/sentiment/accuracy"]).read_text())
    assert (table["columns"], table["data"]) == (["items", "accuracy"], [[12, 0.6], [24, 0.75]])
    assert [kind for kind, _ in read.artifacts.values()] == ["run_table"]  # no model: WANDB_LOG_MODEL is not set


def test_wandb_online_with_no_key_is_refused_with_the_fix(tmp_path, monkeypatch):
    from potato.errors import TrackerError
    from potato.trackers import weights_biases

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc: nobody is logged in
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(TrackerError) as refused:
        weights_biases.report(_tracked(), _Config(tmp_path / "training"), {})
    assert str(refused.value) == (
        "W&B refused the run (No API key configured. Use `wandb login` to log in.): set WANDB_API_KEY in the "
        "annotation server's environment (or run `wandb login` as its user), or WANDB_MODE=offline to keep runs on "
        "disk for `wandb sync`")


def test_wandb_disabled_logs_nothing_and_says_so(tmp_path):
    from potato.trackers import weights_biases

    line = weights_biases.report(_tracked(), _Config(tmp_path / "training"), {"WANDB_MODE": "disabled"})
    assert line == "W&B: WANDB_MODE is disabled, so nothing was logged"
    assert not (tmp_path / "training").exists()
