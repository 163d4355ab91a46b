"""kill -9 during the stages a kill cannot just wait for: code sync, predictions upload, artifact copy.

Each of these stages takes milliseconds on loopback, so the case slows the
link down with the TCP proxy (``throttle``), as a slow home or campus
network would, and kills while the stage is under way: the remote ``tar``
has made its directory, the server has started writing the upload's
temporary file, the model has started to arrive in ``artifacts.partial/``.
The ssh connection cut during training and during the copy are
here too: they are the same runs with ``cut()`` in place of the kill.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from potato.backends.ssh.code import code_archive
from tests.faults.test_kills import LONG, agent_killed, agent_pid, flow_killed, start_agent_for
from tests.support.runs import wait_for

pytestmark = [pytest.mark.sshd, pytest.mark.slurm, pytest.mark.prefect, pytest.mark.training]

REMOTE = ["gpu-server", "cluster"]


def _upload_started(bench, run_id: int) -> list[Path]:
    return list(bench.run_dir(run_id).glob(".predictions.jsonl.upload-*"))


def _copy_started(bench, run_id: int) -> bool:
    partial = bench.run_dir(run_id) / "artifacts.partial"
    return partial.exists() and any(p.is_file() and p.stat().st_size for p in partial.rglob("*"))


@pytest.mark.parametrize("backend", REMOTE)
def test_kill_the_flow_during_code_sync(bench, case, backend):
    remote_dir = bench.remote_dirs[backend]
    shutil.rmtree(remote_dir / "code" / code_archive()[0], ignore_errors=True)  # this version is not there yet
    bench.ssh_proxy.throttle(6000, "up")  # the code (~130 kB) takes seconds to reach the host
    run_id = bench.server.start_run(backend)
    wait_for(lambda: list((remote_dir / "code").glob(".tmp-*")), 60, "the host to unpack the code", interval=0.02)
    os.kill(bench.store.get_run(run_id).flow_pid, signal.SIGKILL)
    bench.wait_for_end(run_id, 60)
    bench.ssh_proxy.heal()
    assert "Copied Potato's code" not in bench.run_log(run_id)
    bench.verdict("kill -9 the flow during code sync", run_id, "failed", flow_killed(bench, run_id), started=case)


def _is_predictions_upload(first: bytes) -> bool:
    return first.startswith(b"PUT ") and b"/predictions " in first.split(b"\r\n", 1)[0]


@pytest.mark.parametrize("backend", [*REMOTE, "lab"])
@pytest.mark.parametrize("who", ["flow", "agent"])
def test_kill_during_the_predictions_upload(bench, case, backend, who, request, many_items):
    """Caught under way: an ssh run's upload once the flow has started writing it (its first ssh packet is in);
    an agent's while the proxy still carries it (``potato start``'s waitress takes a body whole)."""
    workdir = start_agent_for(bench, backend, request)
    more, saved = bench.root / "data" / "more.jsonl", bench.root / "more.jsonl.saved"
    os.replace(more, saved)
    shutil.copyfile(many_items, more)
    try:
        if backend == "lab":
            bench.agent_proxy.throttle(20_000, "up")
            under_way = lambda: bench.agent_proxy.carrying(_is_predictions_upload)  # noqa: E731
        else:
            bench.ssh_proxy.throttle(20_000, "down")  # uploads travel host -> server
            under_way = lambda: _upload_started(bench, run_id)  # noqa: E731
        run_id = bench.server.start_run(backend)
        wait_for(under_way, 120, "the predictions upload to be under way", interval=0.02)
        pid = bench.store.get_run(run_id).flow_pid if who == "flow" else agent_pid(bench, backend, workdir)
        os.kill(pid, signal.SIGKILL)
        run = bench.wait_for_end(run_id, 90)
    finally:
        os.replace(saved, more)
    bench.ssh_proxy.heal()
    bench.agent_proxy.heal()
    if who == "flow":
        message = flow_killed(bench, run_id)
    else:
        message = agent_killed(bench, backend, run_id)
    assert _upload_started(bench, run_id) == []  # the cut upload's temporary file is gone
    assert run.state == "failed"
    bench.verdict(f"kill -9 the {who} during predictions upload", run_id, "failed", message, started=case,
                  agent_workdir=workdir)


@pytest.mark.parametrize("backend", REMOTE)
def test_kill_the_flow_during_the_artifact_copy(bench, case, backend):
    bench.ssh_proxy.throttle(40_000, "down")  # the model (~0.4 MB) takes seconds to come back
    run_id = bench.server.start_run(backend)
    wait_for(lambda: _copy_started(bench, run_id), 120, "the model to start arriving", interval=0.02)
    os.kill(bench.store.get_run(run_id).flow_pid, signal.SIGKILL)
    bench.wait_for_end(run_id, 90)
    bench.ssh_proxy.heal()
    assert not (bench.run_dir(run_id) / "artifacts").exists()  # a partial copy never looks like a model
    bench.verdict("kill -9 the flow during artifact copy", run_id, "failed", flow_killed(bench, run_id),
                  started=case)


@pytest.mark.parametrize("backend", REMOTE)
def test_the_ssh_connection_cut_during_training(bench, case, backend):
    run_id = bench.server.start_run(backend, **LONG)
    bench.wait_for_training(run_id)
    assert bench.ssh_proxy.cut() >= 1
    bench.wait_for_end(run_id, 90)
    message = ("The ssh connection to 127.0.0.1 was lost during the run (Connection to 127.0.0.1 closed by remote "
               "host.); the agent there stops its worker when its connection ends, and Potato checks that nothing "
               "of the run is left there before it ends")
    bench.verdict("ssh connection cut during training", run_id, "failed", message, started=case)


@pytest.mark.parametrize("backend", REMOTE)
def test_the_ssh_connection_cut_during_the_artifact_copy(bench, case, backend):
    bench.ssh_proxy.throttle(40_000, "down")
    run_id = bench.server.start_run(backend)
    wait_for(lambda: _copy_started(bench, run_id), 120, "the model to start arriving", interval=0.02)
    assert bench.ssh_proxy.cut() >= 1
    bench.wait_for_end(run_id, 90)
    bench.ssh_proxy.heal()
    assert len((bench.run_dir(run_id) / "predictions.jsonl").read_text().splitlines()) == 46  # already saved
    assert not (bench.run_dir(run_id) / "artifacts").exists()
    bench.verdict("ssh connection cut during artifact copy", run_id, "failed",
                  "The ssh connection to 127.0.0.1 was lost while the model was copied back (Connection to "
                  "127.0.0.1 closed by remote host.); the run's predictions are saved; only model files are missing "
                  "from artifacts/", started=case)
