"""Data-parallel runs through the real flow: two CPU processes over gloo, as several GPUs would train.

The code path is the one a run with ``gpus: "0,1"`` or ``gres: gpu:2`` takes
(torch's launcher, one process per device, the leader merging their events),
with ``processes: 2`` on the CPU — the documented way to try it without GPUs.
Each run trains the tiny random BERT; the checks are what a user sees: the
scores a one-process run gets, one progress stream, every process gone after
a cancel.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from potato.training.events import read_events
from tests.integration.test_ssh_backend import ssh_project
from tests.support.remote_host import assert_host_clean
from tests.support.runs import (
    potato, potato_background, potato_watching, process_alive, processes_matching, run_dir_of, store_of, tiny_project,
    wait_for, wait_for_state, wait_for_training,
)

pytestmark = [pytest.mark.prefect, pytest.mark.training]

TWO_CPUS = "2 × CPU (1 thread)"


def rank_events(job_dir: Path, rank: int) -> list[dict]:
    return read_events(str(job_dir / "ranks" / str(rank) / "events.jsonl"))[0]


def rank_pids(job_dir: Path) -> list[int]:
    """The pids the training processes reported (their ``started`` events), rank by rank."""
    pids = []
    for rank in (0, 1):
        pids += [e["pid"] for e in rank_events(job_dir, rank) if e["type"] == "started"]
    return pids


def predictions_of(directory: Path) -> dict:
    lines = (directory / "predictions.jsonl").read_text().splitlines()
    return {p["id"]: p for p in map(json.loads, lines)}


def test_a_local_run_in_two_processes_scores_and_predicts_as_one_process_does(prefect_api, tmp_path):
    one = tiny_project(tmp_path / "one")
    two = tiny_project(tmp_path / "two", backends={"local": {"processes": 2}})
    for config in (one, two):
        done = potato("training", "run", str(config))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Holdout scores:\n  sentiment: accuracy 1.000, macro-F1 1.000 (n=" in done.stdout

    store = store_of(two)
    run = store.get_run(1)
    assert (run.state, run.gpu) == ("succeeded", TWO_CPUS)  # the run's device column names both
    assert run.scores == store_of(one).get_run(1).scores
    directory = run_dir_of(two, 1)
    log = (directory / "run.log").read_text()
    assert "Training data-parallel on 2 devices (gloo): CPU (1 thread), CPU (1 thread)" in log
    assert "Schema 'sentiment': trained data-parallel on 2 devices (gloo)" in log
    assert f"The worker started: Python 3.11.7, device {TWO_CPUS}" in log

    # The same predictions, written once, whichever process made them; each carries its probs.
    mine, theirs = predictions_of(directory), predictions_of(run_dir_of(one, 1))
    assert mine.keys() == theirs.keys() and len(mine) == 60
    agree = sum(mine[i]["label"] == theirs[i]["label"] for i in mine)
    assert agree >= 57, f"only {agree} of 60 labels agree with the one-process run"
    assert all(len(p["probs"]) == 2 and abs(sum(p["probs"]) - 1) < 1e-4 for p in mine.values())
    assert (directory / "artifacts" / "sentiment" / "model.safetensors").exists()

    # Both processes' events, merged into the run's one stream.
    events = store.events(1)
    assert [e.kind for e in events].count("started") == 1
    train = [e.data for e in events if e.kind == "progress" and e.data["phase"] == "train"]
    assert [p["step"] for p in train] == sorted(p["step"] for p in train) and train[-1]["step"] == train[-1]["total"]
    predict_totals = []
    for rank in (0, 1):
        started = [e for e in rank_events(directory, rank) if e["type"] == "started"]
        assert len(started) == 1 and started[0]["device_name"] == "CPU (1 thread)"
        predict_totals.append(max(e["total"] for e in rank_events(directory, rank)
                                  if e["type"] == "progress" and e["phase"] == "predict"))
    merged = [e.data for e in events if e.kind == "progress" and e.data["phase"] == "predict"]
    assert merged[-1]["step"] == merged[-1]["total"] == sum(predict_totals)
    assert not any(map(process_alive, rank_pids(directory))) and processes_matching(str(tmp_path)) == []


def test_cancel_stops_every_training_process(prefect_api, tmp_path):
    config = tiny_project(tmp_path, grace_seconds=5, trainer={"epochs": 100000},
                          backends={"local": {"processes": 2}})
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    store = store_of(config)
    directory = run_dir_of(config, 1)
    try:
        run = wait_for_training(store, 1)
        pids = wait_for(lambda: len(rank_pids(directory)) == 2 and rank_pids(directory), 30, "both processes")
        assert all(map(process_alive, pids)) and run.worker_pid not in pids
        cancel = potato("training", "cancel", str(config), "1")
        assert cancel.returncode == 0
        run = wait_for_state(store, 1, ("cancelled",), timeout=30)
    finally:
        cli.wait(timeout=60)
    assert cli.returncode == 1 and "Run 1 was cancelled" in (tmp_path / "cli.log").read_text()
    for pid in [run.worker_pid, *pids]:
        assert not process_alive(pid), f"process {pid} outlived the cancel"
    done = [e for e in store.events(1) if e.kind == "done"]
    assert done and done[-1].data["status"] == "cancelled"
    for rank in (0, 1):  # each stopped cleanly at the same step, on SIGTERM
        assert rank_events(directory, rank)[-1]["status"] == "cancelled"
    assert not (directory / "predictions.jsonl").exists()


@pytest.mark.sshd
def test_an_ssh_run_trains_in_two_processes_on_the_host(
        prefect_api, sshd_service, ssh_user_config, shared_model, tmp_path):
    config = ssh_project(tmp_path, shared_model, ssh_user_config, python=sshd_service.python,
                         gpus="none", processes=2)
    jobs = Path(sshd_service.user_home) / ".cache/potato-training/jobs"
    seen: set[int] = set()

    def watch_host():  # the training processes' pids, from the job directory on the host
        for job_dir in jobs.glob("*"):
            try:
                seen.update(rank_pids(job_dir))
            except OSError:
                pass

    done = potato_watching(watch_host, "training", "run", str(config))
    assert done.returncode == 0, done.stdout + done.stderr
    run = store_of(config).get_run(1)
    assert (run.state, run.gpu) == ("succeeded", TWO_CPUS)
    assert run.scores["sentiment"]["accuracy"] == 1.0
    log = (run_dir_of(config, 1) / "run.log").read_text()
    assert "The run uses the CPU (gpus: none)" in log
    assert "Training data-parallel on 2 devices (gloo): CPU (1 thread), CPU (1 thread)" in log
    assert len(predictions_of(run_dir_of(config, 1))) == 60
    assert (run_dir_of(config, 1) / "artifacts/sentiment/config.json").exists()
    assert len(seen) == 2 and not any(map(process_alive, seen))
    assert_host_clean(sshd_service, config)
