"""Auto-retraining: the watcher's rules, its counting (as Potato 2.12 counts) and its memory across restarts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from potato.annotations.labels import _pretty_annotated_ids, annotated_ids, count_user_state_annotations
from potato.config import AutoRetrainConfig, load_config
from potato.runs.auto_retrain import AnnotationCounter, AutoRetrainWatcher, ProjectItems, decide
from potato.runs.paths import open_store
from potato.runs.queue import create_run
from tests.support.potato_project import make_project, user_state_dict, write_user_state

ON = AutoRetrainConfig(enabled=True, schemas=("sentiment",), update_frequency=5, min_interval_s=600)


@pytest.mark.parametrize("settings, kw, reason", [
    (AutoRetrainConfig(), {}, "auto-retraining is off (model_training.auto_retrain.enabled)"),
    (ON, {"busy": True}, "a run is queued or running"),
    (ON, {"last_finished_at": 1000.0, "now": 1100.0},
     "waiting 500 more second(s) since the last run ended (min_interval_s 600)"),
    (ON, {"annotations": 13, "at_last_auto_run": 10},
     "waiting for 2 more annotation(s) (3 of 5 since the last automatic run)"),
    (ON, {"annotations": 4, "at_last_auto_run": 10},
     "waiting for 11 more annotation(s) (-6 of 5 since the last automatic run)"),
])
def test_each_reason_not_to_queue(settings, kw, reason):
    args = dict(annotations=100, at_last_auto_run=0, busy=False, last_finished_at=None, now=2000.0)
    args.update(kw)
    assert decide(settings, **args).reason == reason
    assert not decide(settings, **args).queue


def test_queues_at_update_frequency_once_min_interval_passed():
    args = dict(annotations=15, at_last_auto_run=10, busy=False, last_finished_at=1000.0, now=1600.0)
    assert decide(ON, **args).queue


# --------------------------------------------------------------------------- counting


def test_counts_items_annotated_in_labels_spans_links_and_events_once_each(tmp_path):
    state = user_state_dict("alice", {"a": {"sentiment": "positive"}, "b": {"sentiment": "negative"}})
    state["instance_id_to_span_to_value"] = {"b": [], "c": [[{"schema": "x", "name": "y", "start": 0, "end": 1}, "y"]]}
    state["instance_id_to_link_to_value"] = {"d": {"l1": {}}}
    state["instance_id_to_event_to_value"] = {"a": {"e1": {}}}
    path = tmp_path / "user_state.json"
    path.write_text(json.dumps(state, indent=2))
    assert count_user_state_annotations(path, chunk=16) == 4  # a, b, c, d


class Ticks:
    """A clock that moves on by *step* seconds every time it is read."""

    def __init__(self, step: float, now: float = 0.0):
        self.step, self.now = step, now

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_the_counter_parses_only_files_that_changed(tmp_path):
    out = tmp_path / "annotation_output"
    write_user_state(out, "alice", {"a": {"s": "x"}, "b": {"s": "x"}})
    write_user_state(out, "bob", {"a": {"s": "x"}})
    (out / "training").mkdir()  # not a user: no user_state.json
    counter = AnnotationCounter(out, clock=Ticks(100))
    assert (counter.count(), counter.parses) == (3, 2)
    assert (counter.count(), counter.parses) == (3, 2)  # nothing changed: stat only
    write_user_state(out, "bob", {"a": {"s": "x"}, "c": {"s": "y"}})
    assert (counter.count(), counter.parses) == (4, 3)


def test_a_busy_file_is_counted_again_only_once_its_last_count_is_paid_for(tmp_path):
    out = tmp_path / "annotation_output"
    clock = Clock(0.0)
    counter = AnnotationCounter(out, clock=clock, cpu=Ticks(0.05))  # every count costs 50 ms of CPU
    for n in range(1, 4):
        write_user_state(out, "alice", {f"r{i}": {"s": "x"} for i in range(n)})
        clock.now += 0.4
        assert counter.count() == 1  # 50 ms / CPU_SHARE = 1 s: changes within it wait
    clock.now += 0.6
    assert (counter.count(), counter.parses) == (3, 2)


def test_only_annotations_on_items_of_the_project_count(tmp_path):
    config = _project(tmp_path)  # items r0 .. r39
    labels = {i: {"sentiment": "positive"} for i in ["r0", "r1", "\ud83d", "x" * 200_000]
              + [f"planted{k}" for k in range(5000)]}
    path = config.output_annotation_dir / "mallory" / "user_state.json"
    path.parent.mkdir()
    path.write_text(json.dumps(user_state_dict("mallory", labels), indent=2))
    items = ProjectItems(config)
    counter = AnnotationCounter(config.output_annotation_dir, items.current, clock=Ticks(100))
    assert counter.count() == 2
    data = config.data_files[0]
    data.write_text(data.read_text() + '{"id": "planted7", "text": "now an item"}\n')
    assert counter.count() == 3  # the items are read again when a data file changes


def test_the_fast_reader_finds_what_the_careful_reader_finds(tmp_path):
    odd = ["r1", 'quo"te', "back\\slash", "new\nline", "\ud83d", "é", "    indented", "x" * 5000]
    state = user_state_dict("alice", {i: {"sentiment": "positive"} for i in odd})
    state["instance_id_to_span_to_value"] = {"s1": [[{"schema": "x", "name": "y", "start": 0, "end": 1}, "y"]]}
    state["instance_id_to_link_to_value"] = None
    state["instance_id_ordering"] = odd + ["only ordered"]
    path = tmp_path / "user_state.json"
    for indent in (2, None, 4):
        path.write_text(json.dumps(state, indent=indent))
        assert annotated_ids(path) == annotated_ids(path, chunk=16) == set(odd) | {"s1"}
        assert (_pretty_annotated_ids(path.read_bytes()) is None) == (indent != 2)


def test_a_file_that_cannot_be_read_keeps_its_last_count(tmp_path):
    out = tmp_path / "annotation_output"
    path = write_user_state(out, "alice", {"a": {"s": "x"}, "b": {"s": "x"}})
    counter = AnnotationCounter(out)
    assert counter.count() == 2
    path.write_text('{"instance_id_to_label_to_value": {"a": [')  # cut off mid-write
    assert counter.count() == 2


# --------------------------------------------------------------------------- the watcher


class Clock:
    def __init__(self, now: float = 10_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _project(tmp_path: Path, **auto_retrain):
    settings = {"enabled": True, "schemas": ["sentiment"], "update_frequency": 5, "min_interval_s": 60,
                "backend": "lab"}
    settings.update(auto_retrain)
    path = make_project(tmp_path, n_items=40, annotators=("alice",), user_labels={"alice": {}}, model_training={
        "enabled": False, "backends": {"lab": {"type": "agent"}}, "auto_retrain": settings})
    return load_config(path)


def _label(config, n: int) -> None:
    """alice has labelled items r0 .. r{n-1}."""
    write_user_state(config.output_annotation_dir, "alice", {f"r{i}": {"sentiment": "positive"} for i in range(n)})


def test_a_project_that_never_auto_trained_queues_at_once(tmp_path):
    config = _project(tmp_path)
    _label(config, 12)
    store = open_store(config)
    run = AutoRetrainWatcher(config, store, clock=Clock()).check_once()
    assert (run.trigger, run.backend, run.annotation_count, run.schemas) == ("auto", "lab", 12, ["sentiment"])
    assert run.state == "queued"


def test_five_more_queue_one_run_and_a_sixth_does_not_queue_a_second(tmp_path):
    config = _project(tmp_path, update_frequency=5, min_interval_s=0)
    store = open_store(config)
    clock = Clock()
    watcher = AutoRetrainWatcher(config, store, clock=clock)
    _label(config, 4)
    assert watcher.check_once() is None
    assert watcher.status()["text"] == "waiting for 1 more annotation(s) (4 of 5 since the last automatic run)"
    _label(config, 5)
    first = watcher.check_once()
    assert first.annotation_count == 5 and watcher.status()["text"] == f"queued run {first.id}"
    _label(config, 6)
    assert watcher.check_once() is None
    assert watcher.status()["text"] == "a run is queued or running"
    assert [r.trigger for r in store.list_runs()] == ["auto"]


def test_a_restart_neither_loses_nor_repeats_a_trigger(tmp_path):
    config = _project(tmp_path, update_frequency=5, min_interval_s=60)
    store = open_store(config)
    clock = Clock()
    _label(config, 5)
    first = AutoRetrainWatcher(config, store, clock=clock).check_once()
    store.transition(first.id, "succeeded", from_states=("queued",))
    clock.now = store.get_run(first.id).finished_at + 61

    # A new server process: it reads the count at the last auto run from the store.
    assert AutoRetrainWatcher(config, store, clock=clock).check_once() is None
    _label(config, 9)  # four more while the server was down
    restarted = AutoRetrainWatcher(config, store, clock=clock)
    assert restarted.check_once() is None
    assert restarted.status()["since_last_auto_run"] == 4
    _label(config, 10)
    assert AutoRetrainWatcher(config, store, clock=clock).check_once().annotation_count == 10


def test_when_annotations_go_away_the_next_update_frequency_new_ones_trigger(tmp_path):
    config = _project(tmp_path, update_frequency=5, min_interval_s=0)
    store = open_store(config)
    _label(config, 5)
    planted = {f"planted{k}": {"sentiment": "positive"} for k in range(5000)}  # ids that are no items
    write_user_state(config.output_annotation_dir, "mallory", {"r30": {"sentiment": "negative"}, **planted})
    first = AutoRetrainWatcher(config, store, clock=Clock()).check_once()
    assert first.annotation_count == 6  # the 5000 planted ids count for nothing
    store.transition(first.id, "succeeded", from_states=("queued",))
    shutil.rmtree(config.output_annotation_dir / "mallory")  # an admin removed the annotator
    watcher = AutoRetrainWatcher(config, store, clock=Clock(store.get_run(first.id).finished_at + 1))
    assert watcher.check_once() is None and store.get_run(first.id).annotation_count == 5
    assert watcher.status()["text"] == "waiting for 5 more annotation(s) (0 of 5 since the last automatic run)"
    _label(config, 10)
    assert AutoRetrainWatcher(config, store, clock=Clock(store.get_run(first.id).finished_at + 1)).check_once()


def test_min_interval_counts_from_any_run_that_ended(tmp_path):
    config = _project(tmp_path, min_interval_s=60)
    store = open_store(config)
    clock = Clock()
    manual = create_run(config, store)
    store.transition(manual.id, "failed", from_states=("queued",))
    clock.now = store.get_run(manual.id).finished_at + 30
    _label(config, 20)
    watcher = AutoRetrainWatcher(config, store, clock=clock)
    assert watcher.check_once() is None
    assert watcher.status()["text"] == "waiting 30 more second(s) since the last run ended (min_interval_s 60)"
    clock.now += 31
    assert watcher.check_once().trigger == "auto"


def test_manual_runs_do_not_move_the_count(tmp_path):
    config = _project(tmp_path, min_interval_s=0)
    store = open_store(config)
    _label(config, 7)
    manual = create_run(config, store)
    assert (manual.trigger, manual.annotation_count) == ("manual", None)
    store.transition(manual.id, "succeeded", from_states=("queued",))
    assert AutoRetrainWatcher(config, store, clock=Clock(store.get_run(manual.id).finished_at + 1)).check_once()


def test_the_store_refuses_a_second_queued_run_for_a_watcher_that_raced(tmp_path):
    config = _project(tmp_path)
    store = open_store(config)
    assert create_run(config, store, trigger="auto", only_when_idle=True) is not None
    assert create_run(config, store, trigger="auto", only_when_idle=True) is None
    assert store.count_runs() == 1


def test_off_queues_nothing_and_says_so(tmp_path):
    config = _project(tmp_path, enabled=False)
    _label(config, 30)
    store = open_store(config)
    watcher = AutoRetrainWatcher(config, store, clock=Clock())
    assert watcher.check_once() is None and store.count_runs() == 0
    assert watcher.status()["enabled"] is False
