"""What a user reads while a run goes: the step's ETA, a silent step's elapsed time, who cancelled, what to do
next, and times with their offset from UTC."""

from __future__ import annotations

import io
import json
import os
import time

import pytest
from click.testing import CliRunner

from potato import follow
from potato.runs.run_events import describe_progress, time_left
from potato.runs.store import Store
from potato.training import events as events_module
from potato.training.events import EventWriter

NOON_UTC = 1736942400.0  # 2025-01-15 12:00:00 UTC


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_progress_event_carries_the_eta_of_its_phase_from_the_pace_of_its_steps(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(events_module.time, "monotonic", clock)
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path))
    writer.progress("train", 0, 10, epoch=0, force=True, schema="s")  # training starts: no pace yet
    clock.now += 10
    writer.progress("train", 2, 10, epoch=0.2, loss=0.5, force=True, schema="s")  # 2 steps in 10 s: 8 left, 40 s
    clock.now += 5
    writer.progress("train", 10, 10, epoch=1.0, loss=0.3, force=True, schema="s")  # done: nothing left to say
    writer.progress("predict", 0, 5, force=True, schema="s")  # a new phase: its own pace
    clock.now += 2
    writer.progress("predict", 1, 5, force=True, schema="s")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e.get("eta_s") for e in events] == [None, 40.0, None, None, 8.0]
    assert describe_progress(events[1])[0] == "training: step 2 of 10 (epoch 0.2), loss 0.5000, about 40 s left"
    assert describe_progress(events[4])[0] == "predicting: batch 1 of 5, about 10 s left"
    assert describe_progress(events[2])[0] == "training: step 10 of 10 (epoch 1.0), loss 0.3000"


@pytest.mark.parametrize("seconds, said", [
    (0.4, "about 5 s left"), (41.7, "about 40 s left"), (80, "about 1 min 20 s left"),
    (599, "about 9 min 59 s left"), (725, "about 12 min left"), (3725, "about 1 h 02 min left"),
])
def test_the_time_left_is_rounded_as_an_estimate_deserves(seconds, said):
    assert time_left(seconds) == said


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "runs.db")
    yield s
    s.close()


def test_a_step_without_a_bar_says_how_long_it_has_taken_and_a_cancel_says_who(store, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(follow.time, "monotonic", clock)
    run = store.create_run("hf-text-classification", ["sentiment"], "local")
    store.transition(run.id, "running", from_states="queued")
    store.update_run(run.id, step="starting the run's flow")
    out = io.StringIO()
    follower = follow.Follower(store, run.id, out, tty=False)
    follower.update()
    clock.now += 1
    follower.update()  # the same line: nothing new to say
    clock.now += 11
    follower.update()
    store.add_event(run.id, "cancel", {"by": "from the Training page (Cancel run)"})
    clock.now += 6
    follower.update()
    assert out.getvalue().splitlines() == [
        "[run 1] starting the run's flow",
        "[run 1] starting the run's flow (12s)",
        "Cancel requested from the Training page (Cancel run)",
        "[run 1] starting the run's flow (18s)",
    ]


def test_the_end_of_a_run_says_what_to_do_next():
    assert follow.next_steps("my project/config.yaml", 3) == [
        "Next: potato training runs 'my project/config.yaml'   (every run, its state and scores)",
        "      potato start 'my project/config.yaml'   then open http://127.0.0.1:8000/admin/training/runs/3 "
        "(log in with the config's admin_api_key)",
    ]
    assert follow.prefect_ready("http://127.0.0.1:4321/api", 12.4) == \
        "Prefect API ready at http://127.0.0.1:4321/api after 12s"


@pytest.fixture
def berlin():
    before = os.environ.get("TZ")
    os.environ["TZ"] = "Europe/Berlin"
    time.tzset()
    yield
    if before is None:
        os.environ.pop("TZ")
    else:
        os.environ["TZ"] = before
    time.tzset()


def test_times_carry_their_offset_from_utc(berlin, tmp_path):
    from potato.cli import main
    from tests.support.potato_project import make_project

    assert follow.format_time(NOON_UTC) == "2025-01-15 13:00:00 UTC+01:00"
    assert follow.format_time(NOON_UTC + 182 * 86400) == "2025-07-16 14:00:00 UTC+02:00"  # summer time
    assert follow.utc_offset(0) == "UTC" and follow.utc_offset(-9000) == "UTC-02:30"
    config = make_project(tmp_path, n_items=4)
    store = Store(tmp_path / "annotation_output" / "training" / "runs.db")
    run = store.create_run("hf-text-classification", ["sentiment"], "local")
    store.transition(run.id, "running", from_states="queued", started_at=NOON_UTC)
    listed = CliRunner().invoke(main, ["training", "runs", str(config)])
    cells = [cell.strip() for cell in listed.output.splitlines()[1].split("  ") if cell.strip()]
    assert cells[:5] == ["1", "running", "manual", "local", "2025-01-15 13:00:00 UTC+01:00"]


def test_a_prefect_api_that_does_not_start_is_waited_for_aloud_and_fails_the_run_it_held(tmp_path, monkeypatch):
    from contextlib import contextmanager

    from potato.cli import main
    from potato.errors import PrefectApiError
    from potato.runs import prefect_api
    from tests.support.potato_project import make_project

    refusal = ("The Prefect API server did not become healthy at http://127.0.0.1:4242/api within 90 seconds; "
               "see 'server.log'")

    @contextmanager
    def never_healthy(training_dir):  # as start_embedded ends when its deadline passes
        time.sleep(0.35)
        raise PrefectApiError(refusal)
        yield

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(prefect_api, "embedded_prefect", never_healthy)
    monkeypatch.setattr(follow, "STILL_WAITING_EVERY_S", 0.1)
    config = str(make_project(tmp_path, n_items=4))
    done = CliRunner().invoke(main, ["training", "run", config])
    assert done.exit_code == 1
    lines = done.output.splitlines()
    assert lines[:2] == ["Run 1 queued: hf-text-classification on sentiment, runs on local (this machine)",
                         "Starting Prefect, which runs each run as a flow (the project's own API, reused once it "
                         "runs)…"]
    assert lines[2:-1] and set(lines[2:-1]) == {"  … Prefect is still starting (0s)"}  # a line a tick, not silence
    assert lines[-1] == (f"Error: {refusal}. Run 1 did not start and is marked failed; start it again: potato "
                         f"training run {config}")
    run = Store(tmp_path / "annotation_output" / "training" / "runs.db").get_run(1)
    assert (run.state, run.error) == ("failed", refusal)  # nothing left queued for a later run to wait behind
