"""Experiment trackers' pure parts: the config's names, the step numbers from events, the words of a refusal."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import pytest

from potato.errors import TrackerError
from potato.runs.store import Event
from potato.trackers import pictures, tracked_run
from potato.trackers.mlflow_rest import TrackingServer
from potato.validate import validate_config_file
from tests.support.potato_project import make_project


def test_report_to_names_the_trackers_and_refuses_the_others_saying_which(tmp_path):
    good = make_project(tmp_path / "good", n_items=5, model_training={"report_to": ["mlflow", "tensorboard"]})
    assert validate_config_file(good).errors == ()
    bad = make_project(tmp_path / "bad", n_items=5, model_training={"report_to": ["mlfow", "comet_ml"]})
    messages = [issue.message for issue in validate_config_file(bad).errors]
    assert messages == [
        "model_training.report_to names 'mlfow', not a tracker; did you mean `mlflow`? Trackers: mlflow, "
        "tensorboard, wandb",
        "model_training.report_to names 'comet_ml', a tracker this project does not report to yet. Trackers: "
        "mlflow, tensorboard, wandb"]


class _Run:
    schemas = ["sentiment"]


class _Context:
    run_id, run = 1, _Run()

    def __init__(self, events):
        self.store = self
        self._events = events

    def events(self, run_id):
        return self._events


def test_each_training_event_is_a_step_with_its_loss_rate_and_examples_per_second():
    def progress(seq, t, **data):
        return Event(1, seq, t, "progress", {"phase": "train", "schema": "sentiment", **data})

    steps = tracked_run._steps(_Context([
        progress(1, 100.0, step=0, total=20),                                         # training starts: no step
        progress(2, 102.0, step=5, total=20, loss=0.7, lr=5e-5, examples=16, epoch=1),
        progress(3, 104.0, step=10, total=20, loss=0.5, lr=4e-5, examples=16, epoch=2,
                 validation_loss=0.6, validation_score=0.8),
        progress(4, 105.0, step=5, total=20, loss=0.9, curve=0.5),                   # a learning curve's share
        Event(1, 5, 106.0, "progress", {"phase": "predict", "step": 3, "total": 3}),
    ]))
    assert [(s.step, s.t) for s in steps] == [(5, 102.0), (10, 104.0)]
    assert steps[1].values == {"train/loss": 0.5, "train/learning_rate": 4e-5, "train/epoch": 2.0,
                               "train/validation_loss": 0.6, "train/validation_score": 0.8,
                               "train/examples_per_s": 40.0}  # 5 steps of 16 examples in 2 s
    assert "train/examples_per_s" not in steps[0].values  # the first has nothing to be timed against


def test_metric_names_keep_what_trackers_take():
    assert tracked_run.metric_name("holdout", "tone: 1–5", "f1") == "holdout/tone_ 1_5/f1"
    assert tracked_run.metric_name("", "train", "loss") == "train/loss"


def test_the_tracking_server_s_address_is_checked_and_its_password_never_shown():
    with pytest.raises(TrackerError, match="^MLFLOW_TRACKING_URI is not set in the annotation server's environment"):
        TrackingServer({})
    with pytest.raises(TrackerError, match=r"^MLFLOW_TRACKING_URI is 'file:///srv/mlruns': the annotation server "
                                           r"reports to a tracking server over http\(s\)"):
        TrackingServer({"MLFLOW_TRACKING_URI": "file:///srv/mlruns"})
    client = TrackingServer({"MLFLOW_TRACKING_URI": "https://ann:pw%40x@mlflow.example.org:5000/"})
    assert (client.uri, client.shown) == ("https://mlflow.example.org:5000", "https://mlflow.example.org:5000")
    assert client.headers["Authorization"] == "Basic YW5uOnB3QHg="  # ann:pw@x
    token = TrackingServer({"MLFLOW_TRACKING_URI": "http://h:5000", "MLFLOW_TRACKING_TOKEN": "tok"})
    assert token.headers["Authorization"] == "Bearer tok"


def test_the_pictures_are_svg_that_escapes_every_label():
    shown = {"labels": ["<b>", "a&b"], "confusion": [[3, 1], [0, 2]], "ece": 0.12,
             "reliability": [{"lo": 0.5, "hi": 0.6, "n": 2, "accuracy": 0.5, "confidence": 0.55}]}
    drawn = pictures.of_schema("tone/ä", shown)
    assert sorted(drawn) == ["tone_ä-confusion.svg", "tone_ä-reliability.svg"]  # a file name without the slash
    for svg in drawn.values():
        root = ElementTree.fromstring(svg)  # well-formed whatever the labels hold
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [t.text for t in ElementTree.fromstring(drawn[sorted(drawn)[0]]).iter("{http://www.w3.org/2000/svg}text")]
    assert "<b>" in texts and "a&b" in texts
    assert pictures.of_schema("stars", {"kind": "continuous", "mae": 0.4}) == {}


def test_a_lone_surrogate_in_a_label_is_drawn_as_its_escape():
    svg = pictures.of_schema("tone", {"labels": ["ok\udc00", "bad"], "confusion": [[1, 0], [0, 1]]})["tone-confusion.svg"]
    texts = [t.text for t in ElementTree.fromstring(svg.encode("utf-8")).iter("{http://www.w3.org/2000/svg}text")]
    assert "ok\\udc00" in texts


@pytest.mark.parametrize("answer, said", [
    (b"<html>a login page</html>", "answered /api/2.0/mlflow/experiments/get-by-name?experiment_name=p with "
                                   "something that is not JSON: is MLFLOW_TRACKING_URI an MLflow tracking server?"),
    (b'{"experiment": {"experiment_id": ["1"]}}', "the tracking server's answer has no experiment.experiment_id: is "
                                                  "MLFLOW_TRACKING_URI an MLflow tracking server?"),
])
def test_a_tracking_server_that_answers_nonsense_is_told_apart(answer, said):
    # Not MLflow: an HTTP server whose every answer is *answer*, as a proxy or a misnamed address would give.
    import http.server
    import threading

    from potato.trackers.mlflow_rest import report
    from potato.trackers.tracked_run import TrackedRun

    class Nonsense(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Nonsense)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(TrackerError) as raised:
            report(TrackedRun(1, "run-1", "p", 0.0), {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{server.server_port}"})
    finally:
        server.shutdown()
    assert str(raised.value).endswith(said)
