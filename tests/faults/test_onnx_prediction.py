"""Cancel and kill -9 while the worker predicts in ONNX Runtime, on every backend: no session process is left.

``predict_precision: onnx`` exports the model and predicts in ONNX Runtime in
a process of the worker's own (potato/training/trainers/onnx_session.py), which has
threads of its own. Each case waits until that session process runs —
on this machine, on the ssh host, on the SLURM node or on the agent's
machine — then cancels the run, or kills the worker with SIGKILL.
``FaultBench.verdict`` then checks the run's end word for word and that no
process is left anywhere: the session process is one of the run's.

Cost: about two minutes a case on 2 cores (a tiny model's two epochs, its
export, the session's start; the local case measured 125-137 s under load in
tests/integration/test_onnx_leftovers.py), eight cases.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from potato.runs.queue import CANCELLED_FROM_API
from tests.faults.test_kills import BACKENDS, start_agent_for, worker_killed, worker_pid
from tests.support.faults import file_hashes
from tests.support.remote_host import host_processes
from tests.support.runs import processes_matching, wait_for

pytestmark = [pytest.mark.sshd, pytest.mark.slurm, pytest.mark.prefect, pytest.mark.training]

ONNX = {"predict_precision": "onnx"}
SESSION = "potato.training.trainers.onnx_session"


@pytest.fixture(scope="module")
def to_predict(bench):
    """30 000 items nobody labelled in place of data/more.jsonl: prediction then lasts long enough to be caught."""
    more = bench.root / "data" / "more.jsonl"
    saved = bench.root / "more.jsonl.onnx-saved"
    os.replace(more, saved)
    more.write_text("".join(f'{{"id": "p{i}", "text": "not labelled yet, item {i}"}}\n' for i in range(30_000)))
    # This file is the test's own change: every case checks that no run changed the data files after it.
    before = dict(bench.annotator_files)
    bench.annotator_files.update(file_hashes([more]))
    yield
    os.replace(saved, more)
    bench.annotator_files.clear()
    bench.annotator_files.update(before)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def session_running(bench, backend: str, workdir: Path | None) -> bool:
    """Whether the run's ONNX Runtime session process runs, wherever its worker does."""
    if backend in ("gpu-server", "cluster"):
        return any(SESSION in line for line in host_processes(bench.sshd_service))
    where = str(workdir / "jobs") if workdir is not None else str(bench.root)
    return any(SESSION.encode() in _cmdline(pid) for pid in processes_matching(where))


def _wait_for_session(bench, backend: str, run_id: int, workdir: Path | None) -> None:
    def running() -> bool:
        if bench.store.get_run(run_id).is_finished:
            raise AssertionError(f"run {run_id} ended before its ONNX Runtime session was seen:\n"
                                 f"{bench.run_log(run_id)[-3000:]}")
        return session_running(bench, backend, workdir)
    wait_for(running, 240, f"run {run_id}'s ONNX Runtime session process", interval=0.05)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_the_worker_during_onnx_prediction(bench, case, backend, request, to_predict):
    workdir = start_agent_for(bench, backend, request)
    run_id = bench.server.start_run(backend, **ONNX)
    _wait_for_session(bench, backend, run_id, workdir)
    os.kill(worker_pid(bench, backend, run_id, workdir), signal.SIGKILL)
    bench.wait_for_end(run_id, 90)
    bench.verdict("kill -9 the worker during ONNX Runtime prediction", run_id, "failed",
                  worker_killed(bench, backend, run_id), started=case, agent_workdir=workdir)
    assert not session_running(bench, backend, workdir)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancel_during_onnx_prediction(bench, case, backend, request, to_predict):
    workdir = start_agent_for(bench, backend, request)
    run_id = bench.server.start_run(backend, **ONNX)
    _wait_for_session(bench, backend, run_id, workdir)
    status, body = bench.server.api("POST", f"runs/{run_id}/cancel")
    assert status == 200, body
    bench.wait_for_end(run_id, 90)
    bench.verdict("Cancel run during ONNX Runtime prediction", run_id, "cancelled",
                  f"Cancelled {CANCELLED_FROM_API}", started=case, agent_workdir=workdir)
    assert not session_running(bench, backend, workdir)
