"""Cancel and kill -9 while a local run predicts in ONNX Runtime: no session process is left behind.

``predict_precision: onnx`` predicts in ONNX Runtime in a child process of
the worker (potato/training/trainers/onnx_session.py) with threads of its own. The
run here trains a tiny BERT for one epoch, then has 30 000 items to predict;
the test waits until the session process runs, then cancels the run (or
SIGKILLs the worker) and checks that no process of the project is left. The
same cases on every backend (ssh, slurm, agent) are in
tests/faults/test_onnx_prediction.py, which needs the sshd and SLURM services.

Cost: 125-137 s a case measured on 2 shared cores under load (worker start, one epoch, the export, the
session's start), two cases: marked slow.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from potato.config import load_config
from tests.support.runs import (
    potato, potato_background, processes_matching, store_of, tiny_project, wait_for, wait_for_state,
)

pytestmark = [pytest.mark.prefect, pytest.mark.training, pytest.mark.slow]

SESSION = b"potato.training.trainers.onnx_session"


def _sessions(root: Path) -> list[int]:
    found = []
    for pid in processes_matching(str(root)):
        try:
            if SESSION in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


@pytest.mark.parametrize("how", ["cancel", "kill -9 the worker"])
def test_no_onnx_session_process_outlives_its_run(prefect_api, tmp_path, how):
    pytest.importorskip("onnxruntime")
    config = tiny_project(tmp_path, 60, grace_seconds=5, trainer={"predict_precision": "onnx", "epochs": 1})
    with open(load_config(config).data_files[0], "a", encoding="utf-8") as out:
        out.writelines(f'{{"id": "u{i}", "text": "not labelled yet, item {i}"}}\n' for i in range(30_000))
    store = store_of(config)
    cli = potato_background("training", "run", str(config), log=tmp_path / "cli.log")
    try:
        def session_running() -> list[int]:
            run = store.get_run(1) if store.count_runs() else None
            assert run is None or not run.is_finished, (tmp_path / "cli.log").read_text()[-3000:]
            return _sessions(tmp_path)
        wait_for(session_running, 300, "the worker's ONNX Runtime session process", interval=0.05)
        if how == "cancel":
            assert potato("training", "cancel", str(config), "1").returncode == 0
            wait_for_state(store, 1, ("cancelled",), timeout=60)
        else:
            os.kill(store.get_run(1).worker_pid, signal.SIGKILL)
            assert wait_for_state(store, 1, ("failed",), timeout=60).error == "The worker was killed by signal 9"
    finally:
        cli.wait(timeout=60)
    wait_for(lambda: processes_matching(str(tmp_path)) == [], 20, "every process of the run to be gone")
