"""potato.runs.prefect_runs without a Prefect API: project names, tags, messages, the cancel watch, the no-worker rule."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from deployments.create import SetupError, build_project_deploy_argv, check_schedule
from potato.errors import NoPrefectWorker
from potato.runs import prefect_runs
from potato.runs.prefect_runs import CancelWatch, cancel_message, is_cancel, no_worker_in_time, project_key
from potato.runs.store import Store
from tests.support.potato_project import make_project, project_config


@pytest.mark.parametrize("task_name, expected_slug", [
    ("Review Sentiment", "review-sentiment"),
    ("  Émotions / 2024: round #3 ", "motions-2024-round-3"),
    ("", "project"),
    ("!!!", "project"),
    ("x" * 80, "x" * 40),
])
def test_project_key_is_a_slug_and_a_hash_of_the_training_dir(task_name, expected_slug):
    key = project_key(task_name, Path("/srv/a/annotation_output/training"))
    slug, digest = key.rsplit("-", 1)
    assert slug == expected_slug and len(digest) == 6 and int(digest, 16) >= 0
    assert project_key(task_name, Path("/srv/a/annotation_output/training")) == key  # stable
    assert project_key(task_name, Path("/srv/b/annotation_output/training")) != key  # one per project


def test_limit_name_and_tags_name_the_project(tmp_path):
    config = project_config(make_project(tmp_path))
    key = prefect_runs.project_key_of(config)
    assert key == project_key("Review Sentiment", config.training_dir.resolve())
    assert prefect_runs.limit_name(config) == f"potato-training-{key}"
    run = SimpleNamespace(backend="gpu-server", trainers={"hf-text-classification": ["sentiment"]})
    assert prefect_runs.flow_run_tags(config, run) == [
        "potato", f"project:{key}", "backend:gpu-server", "trainer:hf-text-classification"]
    run = SimpleNamespace(backend="local", trainers={"hf-text-classification": ["sentiment"],
                                                     "hf-span-tagging": ["entities"]})
    assert prefect_runs.flow_run_tags(config, run)[-2:] == ["trainer:hf-text-classification",
                                                            "trainer:hf-span-tagging"]


def test_cancel_messages_say_where_the_cancel_came_from():
    assert cancel_message(7, in_prefect=True) == "Run 7 was cancelled in Prefect; its worker was stopped"
    assert cancel_message(7, in_prefect=False) == "Run 7 was cancelled in Potato (Cancel run); its worker was stopped"


def _state(name: str):
    from prefect.states import Cancelled, Cancelling, Completed, Running

    return {"Running": Running, "Cancelling": Cancelling, "Cancelled": Cancelled, "Completed": Completed}[name]()


@pytest.mark.parametrize("name, expected", [
    ("Running", False), ("Completed", False), ("Cancelling", True), ("Cancelled", True)])
def test_is_cancel(name, expected):
    assert is_cancel(_state(name)) is expected
    assert is_cancel(None) is False


def test_cancel_watch_fires_once_when_prefect_says_cancelling():
    answers = iter(["Running", "boom", "Running", "Cancelling"])
    fired = []

    def read(flow_run_id):
        answer = next(answers, "Cancelling")
        if answer == "boom":  # Prefect unreachable for a moment: the watch goes on
            raise OSError("connection refused")
        return _state(answer)

    with CancelWatch("fr-1", lambda: fired.append(time.monotonic()), interval=0.01, read=read):
        deadline = time.monotonic() + 5
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
    assert len(fired) == 1


def test_cancel_watch_trigger_fires_without_asking_prefect():
    fired = threading.Event()

    def read(flow_run_id):
        raise AssertionError("a trigger must not wait for Prefect")

    with CancelWatch(None, fired.set, interval=60, read=read) as watch:
        watch.trigger()
        assert fired.wait(5)


def test_cancel_watch_stops_quietly_when_the_block_ends():
    calls = []
    started = time.monotonic()
    with CancelWatch("fr-1", lambda: calls.append("fired"), interval=60, read=lambda _id: _state("Running")):
        pass
    assert calls == [] and time.monotonic() - started < 5


def test_a_run_waiting_for_a_worker_fails_after_max_wall_seconds_naming_the_pool(tmp_path, monkeypatch):
    config = project_config(make_project(tmp_path), max_wall_seconds=60, prefect_deployment="training-run/potato")
    store = Store(tmp_path / "runs.db")
    run = store.create_run("hf-text-classification", ["sentiment"], "local")
    store.transition(run.id, "running", from_states=("queued",), prefect_flow_run_id="fr-1")
    run = store.get_run(run.id)
    given_up = []
    monkeypatch.setattr(prefect_runs, "cancel_flow_run",
                        lambda flow_run_id, message: given_up.append((flow_run_id, message)) or "potato-training")

    assert not no_worker_in_time(config, run, run.started_at + 60)
    assert prefect_runs.fail_runs_no_worker_started(config, store, now=run.started_at + 60) == []
    [failed] = prefect_runs.fail_runs_no_worker_started(config, store, now=run.started_at + 61)
    assert (failed.state, failed.error) == ("failed", str(NoPrefectWorker(run.id, "potato-training", 60)))
    assert failed.error == (
        f"No Prefect worker started run {run.id} within 60 seconds of its queueing on work pool 'potato-training' "
        "(model_training.max_wall_seconds); start one on the annotation server's host: "
        "prefect worker start --pool potato-training")
    assert given_up == [("fr-1", "No Prefect worker started it in time")]

    started = store.create_run("hf-text-classification", ["sentiment"], "local")
    store.transition(started.id, "running", from_states=("queued",), prefect_flow_run_id="fr-2", flow_pid=1)
    assert not no_worker_in_time(config, store.get_run(started.id), time.time() + 3600)  # a worker has it


def test_no_limit_means_waiting_for_a_worker_until_cancelled(tmp_path):
    config = project_config(make_project(tmp_path), max_wall_seconds=None)
    run = SimpleNamespace(state="running", flow_pid=None, prefect_flow_run_id="fr-1", started_at=0.0)
    assert not no_worker_in_time(config, run, 10**9)


def test_project_deploy_argv_and_schedule_checks():
    argv = build_project_deploy_argv("review-sentiment-3f9a1c", Path("/srv/review/config.yaml"),
                                     ["potato", "project:review-sentiment-3f9a1c"], "0 3 * * *", "Europe/Berlin",
                                     python="/py")
    assert argv == [
        "/py", "-m", "prefect", "--no-prompt", "deploy", "flows/training_run.py:training_run",
        "--name", "review-sentiment-3f9a1c", "--pool", "potato-training",
        "--params", '{"config": "/srv/review/config.yaml"}',
        "--tag", "potato", "--tag", "project:review-sentiment-3f9a1c",
        "--cron", "0 3 * * *", "--timezone", "Europe/Berlin"]
    assert build_project_deploy_argv("k", Path("/c.yaml"), [], "0 3 * * *", None)[-4:] == [
        "--cron", "0 3 * * *", "--timezone", "UTC"]
    assert "--cron" not in build_project_deploy_argv("k", Path("/c.yaml"), [], None, None)
    check_schedule("0 3 * * *", "Europe/Berlin")
    with pytest.raises(SetupError) as bad_cron:
        check_schedule("0 3 * *", None)
    assert str(bad_cron.value) == (
        "--cron '0 3 * *' --timezone 'UTC' is not a schedule Prefect accepts (Value error, Invalid cron string: "
        "\"0 3 * *\"). Example: --cron \"0 3 * * *\" --timezone Europe/Berlin")
    with pytest.raises(SetupError, match="'Mars/Base' is not a schedule Prefect accepts"):
        check_schedule("0 3 * * *", "Mars/Base")


def test_deployments_create_refuses_bad_input_before_calling_prefect(tmp_path, monkeypatch, capsys):
    from deployments.create import main

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # nothing listens: any Prefect call would fail
    config = make_project(tmp_path)
    assert main(["--config", str(config), "--cron", "0 3 * *"]) == 2
    assert capsys.readouterr().err.startswith("Error: --cron '0 3 * *' --timezone 'UTC' is not a schedule")
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["--cron", "0 3 * * *"])
    assert usage.value.code == 2
    assert "--cron and --timezone schedule one project's runs: give its --config too" in capsys.readouterr().err
    monkeypatch.delenv("PREFECT_API_URL")
    assert main([]) == 1
    assert capsys.readouterr().err.startswith("PREFECT_API_URL is not set")
