"""Local runs end to end: the real CLI, the real flow, a real Prefect API, the real worker.

Each run trains a tiny random BERT on a small Potato project (a few seconds of
training after ~5 s of worker start-up).
"""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from potato.config import load_config
from potato.runs.paths import open_store
from potato.runs.prefect_runs import project_key_of
from potato.runs.queue import create_run
from potato.text.score_text import score_line
from tests.support.runs import (
    assert_private,
    potato,
    potato_background,
    process_alive,
    processes_matching,
    run_dir_of,
    store_of,
    tiny_project,
    wait_for,
    wait_for_state,
    wait_for_training,
)

pytestmark = [pytest.mark.prefect, pytest.mark.training]


def _flow_run(flow_run_id: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
    return flow_run, sorted(tasks, key=lambda t: t.start_time or t.expected_start_time)


def test_a_local_run_trains_predicts_scores_and_writes_back(prefect_api, tmp_path):
    config = tiny_project(tmp_path)
    done = potato("training", "run", str(config))

    assert done.returncode == 0, done.stdout + done.stderr
    assert "Run 1 queued: hf-text-classification on sentiment, runs on local (this machine)" in done.stdout
    assert "Run 1 succeeded in" in done.stdout
    assert "Holdout scores:\n  sentiment: accuracy 1.000, macro-F1 1.000 (n=" in done.stdout
    # From its first line to its last, the command says what it waits for and what comes next.
    lines = done.stdout.splitlines()
    assert lines[1] == ("Starting Prefect, which runs each run as a flow (the project's own API, reused once it "
                        "runs)…") or lines[1].startswith("Connecting to the Prefect API at ")
    assert lines[2].startswith("Prefect API ready at http://127.0.0.1:") and " after " in lines[2]
    assert lines[-2:] == [
        f"Next: potato training runs {config}   (every run, its state and scores)",
        f"      potato start {config}   then open http://127.0.0.1:8000/admin/training/runs/1 (log in with the "
        "config's admin_api_key)"]

    store = store_of(config)
    run = store.get_run(1)
    # The worker's progress carries its phase's ETA once a step is done; the step row says it.
    # A report between the phase's first and its last carries the pace's ETA (a tiny model may train within
    # one report's interval, and then there is none between).
    train = [e.data for e in store.events(1) if e.kind == "progress" and e.data.get("phase") == "train"]
    paced = [e for e in train if e.get("eta_s") is not None]
    assert (paced or len(train) <= 2) and all(e["eta_s"] >= 0 for e in paced), train
    assert (run.state, run.backend, run.error) == ("succeeded", "local", None)
    assert run.scores["sentiment"]["accuracy"] == 1.0
    assert run.gpu == "CPU (2 threads)"

    directory = run_dir_of(config, 1)
    predictions = [json.loads(line) for line in (directory / "predictions.jsonl").read_text().splitlines()]
    assert {p["id"] for p in predictions} == {f"r{i}" for i in range(60)}  # include_unlabeled: all items
    assert all(p["label"] in ("positive", "negative") and 0.5 <= p["confidence"] <= 1 for p in predictions)
    assert (directory / "artifacts" / "sentiment" / "config.json").exists()
    assert run.artifact_uri == str(directory / "artifacts")
    assert not (directory / "bundle").exists()  # clean-up removed it

    written = [json.loads(line) for line in (config.parent / "annotation_output/training/predictions.jsonl").read_text().splitlines()]
    assert written and all(w["predictions"]["sentiment"]["run_id"] == 1 for w in written)
    assert all(w["predictions"]["sentiment"]["confidence"] >= 0.5 for w in written)
    log = (directory / "run.log").read_text()
    assert "The worker started: Python" in log
    trained = sum(1 for p in predictions if p["id"] not in {w["id"] for w in written})
    assert f"Wrote back to {config.parent / 'annotation_output/training/predictions.jsonl'}: sentiment: " \
           f"{len(written)} predictions (" in log and "trained on (leak guard)" in log
    assert trained > 0  # the leak guard kept the items the run trained on out

    flow_run, tasks = _flow_run(run.prefect_flow_run_id)
    assert flow_run.name == "run-1" and flow_run.state.is_completed()
    names = [t.name for t in tasks]
    assert names == [
        "build the bundle of run 1", "connect to this machine", "pick GPU on this machine",
        "sync code to this machine", "spawn the worker on this machine", "relay events from this machine",
        "record results of run 1", "fetch artifacts from this machine", "clean up on this machine",
    ]
    assert processes_matching(str(tmp_path)) == []
    assert_private(config.parent / "annotation_output/training")  # store, WAL, logs, model, predictions

    # The project's own artifacts on Prefect's Artifacts page: its report and its scores per label.
    from prefect.artifacts import Artifact

    project = project_key_of(load_config(config))
    report = Artifact.get(f"potato-{project}-report")
    lines = report.data.splitlines()
    assert (lines[0], report.type, report.description) == ("# Run 1 of Review Sentiment", "markdown",
                                                           "Run 1 of Review Sentiment")
    assert f"- {score_line('sentiment', run.scores['sentiment'])}" in lines
    assert lines[lines.index("## What annotators see") + 2] == f"- {len(written)} item(s) pre-filled"
    labels = Artifact.get(f"potato-{project}-label-scores")
    rows = json.loads(labels.data) if isinstance(labels.data, str) else labels.data
    assert sorted((r["schema"], r["label"], r["f1"]) for r in rows) == [("sentiment", "negative", 1.0),
                                                                        ("sentiment", "positive", 1.0)]
    assert Artifact.get(f"potato-{project}-run-page") is None  # no server has said where its page is


def test_curve_trains_on_shares_of_the_labels_and_says_whether_more_would_help(prefect_api, tmp_path):
    from prefect.artifacts import Artifact

    config = tiny_project(tmp_path)
    done = potato("training", "run", str(config), "--curve")
    assert done.returncode == 0, done.stdout + done.stderr
    run = store_of(config).get_run(1)
    curve = run.scores["sentiment"]["curve"]
    assert [p["share"] for p in curve] == [0.25, 0.5, 0.75, 1.0]
    trained = [p["items"] for p in curve]
    assert trained == sorted(trained) and trained[-1] > trained[0] > 0
    assert curve[-1]["accuracy"] == run.scores["sentiment"]["accuracy"]
    # The command prints the curve and its verdict; the run log has the worker's line and the gate's.
    line = next(line for line in done.stdout.splitlines() if line.startswith("sentiment: learning curve of accuracy, "))
    assert re.fullmatch(r"sentiment: learning curve of accuracy, 25 % \(\d+ items\) [\d.]+, 50 % .*, 100 % "
                        r"\(\d+ items\) 1\.000; (still rising|flat|levelling off|falling).*", line), line
    log = (run_dir_of(config, 1) / "run.log").read_text()
    assert "Schema 'sentiment': learning curve, accuracy on the " in log
    gate = re.compile(r"sentiment: holdout accuracy 1\.00 beats always answering `(positive|negative)` "
                      r"\(0\.\d\d\) on \d+ held-out answers: written back")
    assert gate.search(log)
    assert any(line.startswith("Quality gate: ") and gate.fullmatch(line[len("Quality gate: "):])
               for line in done.stdout.splitlines()), done.stdout
    artifact = Artifact.get("run-1-learning-curve")
    rows = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    assert [(r["schema"], r["share"], r["items"]) for r in rows] == [("sentiment", p["share"], p["items"]) for p in curve]
    assert artifact.description == f"Learning curve of run 1: {line}"

    # The stopping signal: a second run says how many unlabelled items' predicted labels changed.
    again = potato("training", "run", str(config))
    assert again.returncode == 0, again.stdout + again.stderr
    changed = re.search(r"sentiment: (\d+) of (\d+) unlabelled items' predicted labels changed since run 1 "
                        r"\(([\d.]+) %\)", (run_dir_of(config, 2) / "run.log").read_text())
    assert changed and int(changed.group(2)) > 0, (run_dir_of(config, 2) / "run.log").read_text()
    listed = potato("training", "runs", str(config)).stdout.splitlines()
    start = listed[0].index("CHANGED")
    assert listed[1].startswith("2 ") and listed[1][start:].startswith(f"{changed.group(3)} %")


def test_holdout_fraction_0_trains_on_every_label_and_says_there_are_no_holdout_scores(prefect_api, tmp_path):
    from prefect.client.orchestration import get_client

    config = tiny_project(tmp_path, n_items=20, holdout_fraction=0, trainer={"epochs": 2})
    done = potato("training", "run", str(config))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Holdout scores:\n  sentiment: no holdout scores\n" in done.stdout
    run = store_of(config).get_run(1)
    assert (run.state, run.scores) == (
        "succeeded", {"sentiment": {"kind": "nominal", "accuracy": None, "macro_f1": None, "n": 0}})
    log = (run_dir_of(config, 1) / "run.log").read_text()
    assert "Holdout sentiment: no holdout scores (no labelled item was held out of training)" in log
    assert " 0 held out, " in log
    assert potato("training", "runs", str(config)).stdout.splitlines()[1].endswith("sentiment: no holdout scores")
    with get_client(sync_client=True) as client:
        artifact = client.read_latest_artifacts()  # the run's scores table, as the Prefect UI shows it
    table = next(a for a in artifact if a.key == "run-1-scores")
    assert json.loads(table.data) == [{"schema": "sentiment", "kind": "nominal", "scores": "sentiment: no holdout scores",
                                       "accuracy": None, "macro_f1": None, "n": 0}]


def test_runs_execute_one_at_a_time_in_fifo_order(prefect_api, tmp_path):
    config = tiny_project(tmp_path, trainer={"epochs": 3}, retain_runs=1)
    cfg = load_config(config)
    store = open_store(cfg)
    first = create_run(cfg, store)
    second = create_run(cfg, store)

    # The CLI's own run is the third; its dispatcher must start the older two first, one at a time.
    done = potato("training", "run", str(config))
    assert done.returncode == 0, done.stdout + done.stderr

    a, b, c = (store.get_run(i) for i in (first.id, second.id, 3))
    assert [r.state for r in (a, b, c)] == ["succeeded"] * 3
    assert a.finished_at <= b.started_at and b.finished_at <= c.started_at
    # retain_runs: 1 — each run, once ended, deleted the directory of the one before.
    assert sorted(p.name for p in run_dir_of(config, 1).parent.iterdir()) == ["3"]
    assert "Deleted the directories of run(s) 2 (model_training.retain_runs: 1)" in (
        run_dir_of(config, 3) / "run.log").read_text()


def test_max_wall_seconds_stops_a_run(prefect_api, tmp_path):
    config = tiny_project(tmp_path, max_wall_seconds=8, trainer={"epochs": 100000})
    done = potato("training", "run", str(config))

    assert done.returncode == 1
    message = "The run was stopped after 8 seconds: it reached model_training.max_wall_seconds (8)"
    assert f"Run 1 failed: {message}" in done.stdout
    run = store_of(config).get_run(1)
    assert (run.state, run.error) == ("failed", message)
    assert run.finished_at - run.started_at < 8 + 5
    assert not process_alive(run.worker_pid) and processes_matching(str(tmp_path)) == []


def test_heartbeat_silence_fails_a_run(prefect_api, tmp_path):
    config = tiny_project(tmp_path, heartbeat_timeout_s=10, trainer={"epochs": 100000})
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    try:
        run = wait_for_training(store, 1)
        os.kill(run.worker_pid, signal.SIGSTOP)  # the worker lives but says nothing more
        run = wait_for_state(store, 1, ("failed",), timeout=30)
    finally:
        cli.wait(timeout=60)
    assert run.error == "No word from the worker on local for 10 seconds"
    assert cli.returncode == 1
    assert "Run 1 failed: No word from the worker on local for 10 seconds" in (tmp_path / "cli.log").read_text()
    assert not process_alive(run.worker_pid) and processes_matching(str(tmp_path)) == []


def test_cancel_stops_the_worker_and_leaves_no_process(prefect_api, tmp_path):
    config = tiny_project(tmp_path, grace_seconds=5, trainer={"epochs": 100000})
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    try:
        run = wait_for_training(store, 1)
        cancel = potato("training", "cancel", str(config), "1")
        assert cancel.returncode == 0
        assert cancel.stdout == "Run 1: cancel requested; the worker gets SIGTERM, then SIGKILL after 5 s\n"
        run = wait_for_state(store, 1, ("cancelled",), timeout=30)
    finally:
        cli.wait(timeout=60)
    assert cli.returncode == 1
    assert "Run 1 was cancelled" in (tmp_path / "cli.log").read_text()
    assert not process_alive(run.worker_pid) and processes_matching(str(tmp_path)) == []
    done = [e for e in store.events(1) if e.kind == "done"]
    assert done and done[-1].data["status"] == "cancelled"  # the worker stopped on SIGTERM, cleanly
    flow_run, _ = _flow_run(run.prefect_flow_run_id)  # Prefect shows Potato's cancel, with the reason
    assert (flow_run.state.type.value, flow_run.state.message) == (
        "CANCELLED", "Run 1 was cancelled in Potato (Cancel run); its worker was stopped")


def test_ctrl_c_in_the_cli_cancels_the_run(prefect_api, tmp_path):
    config = tiny_project(tmp_path, grace_seconds=5, trainer={"epochs": 100000})
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")  # no terminal: no prompt
    store = store_of(config)
    try:
        run = wait_for_training(store, 1)
        os.kill(cli.pid, signal.SIGINT)
        wait_for_state(store, 1, ("cancelled",), timeout=30)
    finally:
        cli.wait(timeout=60)
    out = (tmp_path / "cli.log").read_text()
    assert cli.returncode == 1 and "Cancelling run 1…" in out and "Run 1 was cancelled" in out
    assert not process_alive(run.worker_pid) and processes_matching(str(tmp_path)) == []


def test_a_queued_run_is_cancelled_at_once(prefect_api, tmp_path):
    config = tiny_project(tmp_path, n_items=20)
    cfg = load_config(config)
    store = open_store(cfg)
    run = create_run(cfg, store)
    cancel = potato("training", "cancel", str(config), str(run.id))
    assert cancel.stdout == f"Run {run.id} was queued and is now cancelled\n"
    assert store.get_run(run.id).state == "cancelled"
    again = potato("training", "cancel", str(config), str(run.id))
    assert again.stdout == f"Run {run.id} already ended: cancelled\n"
    missing = potato("training", "cancel", str(config), "99")
    assert missing.returncode == 1 and "99" in missing.stderr


def test_a_crash_mid_run_is_reconciled_and_the_queue_moves_on(prefect_api, tmp_path):
    config = tiny_project(tmp_path, trainer={"epochs": 100000})
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    run = wait_for_training(store, 1)
    # The machine "crashes": the CLI, the flow and the worker all die at once.
    for pid in (cli.pid, run.flow_pid):
        os.killpg(pid, signal.SIGKILL)
    os.killpg(run.worker_pid, signal.SIGKILL)
    cli.wait(timeout=10)
    wait_for(lambda: not process_alive(run.flow_pid), 10, "the flow process to die")
    assert store.get_run(1).state == "running"  # nobody was left to say otherwise

    done = potato("training", "run", str(config), "--option", "epochs=3")
    assert done.returncode == 0, done.stdout + done.stderr
    crashed = store.get_run(1)
    assert crashed.state == "failed"
    assert crashed.error.startswith("The run's flow process is gone")
    assert store.get_run(2).state == "succeeded"
    assert processes_matching(str(tmp_path)) == []


def test_cli_refuses_unknown_backend_and_schema(tmp_path):
    config = tiny_project(tmp_path, n_items=10)
    done = potato("training", "run", str(config), "--backend", "nope")
    assert done.returncode == 1
    assert done.stderr == "Error: No backend named 'nope' in model_training.backends; known backends: local\n"
    done = potato("training", "run", str(config), "--schema", "topic")
    assert done.returncode == 1
    assert done.stderr == "Error: Unknown schema 'topic'; the config's annotation_schemes are: sentiment\n"
    assert not store_of(config).list_runs()


def test_check_local_prints_the_device(tmp_path):
    config = tiny_project(tmp_path, n_items=10)
    done = potato("training", "check", "local", str(config))
    assert (done.returncode, done.stdout) == (0, "local: this machine, CPU (2 threads)\n")
    as_json = json.loads(potato("training", "check", "local", str(config), "--json").stdout)
    assert as_json["ok"] is True and as_json["report"] == ["local: this machine, CPU (2 threads)"]
