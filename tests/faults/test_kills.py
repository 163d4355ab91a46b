"""kill -9 of each process of a run, at each stage, on every backend.

The processes: the flow (the dispatcher's child of ``potato start``), the
worker, the remote agent (on the ssh host or SLURM login node; the polling
agent of an agent backend), and ``potato start`` itself, started again at once.
Stages that need more than a kill to be caught at (code sync, predictions
upload, artifact copy) are in test_stages.py. Every case ends with
``FaultBench.verdict``: the run's end word for word, nothing left anywhere,
the annotators' files untouched.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.support.remote_host import host_processes
from tests.support.runs import processes_matching, wait_for

pytestmark = [pytest.mark.sshd, pytest.mark.slurm, pytest.mark.prefect, pytest.mark.training]

BACKENDS = ["local", "gpu-server", "cluster", "lab"]
LONG = {"epochs": 100000}


def agent_killed(bench, backend: str, run_id: int) -> str:
    """The message of a run whose agent was killed: a pull agent goes silent, an ssh one's connection ends."""
    if backend == "lab":  # its worker died with it; the server hears nothing more
        return "No word from the agent on lab for 20 seconds"
    log = bench.run_dir(run_id) / "agent.log"
    last = [line for line in log.read_text().splitlines() if line.strip()][-1]
    return (f"The agent on 127.0.0.1 exited with status 255 before reporting a result; its last output "
            f"is in {log}: {last}")


def worker_killed(bench, backend: str, run_id: int) -> str:
    """The message of a run whose worker was killed with SIGKILL."""
    if backend == "cluster":  # the job's batch step was the worker (job.sh execs it): SLURM saw it killed
        job = re.search(r"Submitted SLURM job (\d+)", bench.run_log(run_id)).group(1)
        return f"SLURM job {job} ended before the worker finished: its worker was killed by signal 9"
    return "The worker was killed by signal 9"


def flow_killed(bench, run_id: int) -> str:
    return (f"The run's flow process was killed by SIGKILL before the run finished; Potato stopped what the run "
            f"left running (see {bench.run_dir(run_id) / 'flow.log'})")


def agent_workdir(bench, request) -> Path:
    return bench.root / "agents" / re.sub(r"\W+", "-", request.node.name)


def start_agent_for(bench, backend: str, request) -> Path | None:
    """The agent backend needs an agent polling for its runs; the others none. Returns its workdir."""
    if backend != "lab":
        return None
    workdir = agent_workdir(bench, request)
    bench.start_agent(workdir)
    return workdir


def worker_pid(bench, backend: str, run_id: int, workdir: Path | None) -> int:
    """The pid of the run's worker, wherever it runs (this machine, the ssh host, the SLURM node, the agent's)."""
    if backend == "local":
        return bench.store.get_run(run_id).worker_pid
    if backend == "lab":
        [pid] = [p for p in processes_matching(str(workdir / "jobs")) if b"potato.training.worker" in
                 Path(f"/proc/{p}/cmdline").read_bytes()]
        return pid
    [line] = wait_for(lambda: [l for l in host_processes(bench.sshd_service) if "potato.training.worker" in l], 30,
                      "the worker on the host")
    return int(line.split(":")[0])


def agent_pid(bench, backend: str, workdir: Path | None) -> int:
    if backend == "lab":
        return bench.agents[-1].pid
    [line] = [l for l in host_processes(bench.sshd_service) if "potato.training.agent" in l]
    return int(line.split(":")[0])


@pytest.fixture(scope="module")
def big_data_file(bench):
    """A data file of 400 000 items, to put in place of data/more.jsonl: building the bundle then takes seconds."""
    path = bench.root / "big.jsonl"
    with open(path, "w") as fh:
        fh.writelines(f'{{"id": "b{i}", "text": "an item nobody has labelled yet, number {i}"}}\n' for i in range(400_000))
    yield path
    path.unlink(missing_ok=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_the_flow_during_bundle_build(bench, case, backend, big_data_file):
    more = bench.root / "data" / "more.jsonl"
    saved = bench.root / "more.jsonl.saved"
    os.replace(more, saved)
    os.replace(big_data_file, more)
    try:
        run_id = bench.server.start_run(backend)
        bench.wait_for_event(run_id, lambda e: e.kind == "step" and e.data.get("text") == "building the run bundle",
                             60, "the flow to build the bundle")
        os.kill(bench.store.get_run(run_id).flow_pid, signal.SIGKILL)
        bench.wait_for_end(run_id, 60)
    finally:
        os.replace(more, big_data_file)
        os.replace(saved, more)
    assert [e.data["text"] for e in bench.store.events(run_id) if e.kind == "step"][-1] == "building the run bundle"
    bench.verdict("kill -9 the flow during bundle build", run_id, "failed", flow_killed(bench, run_id),
                  started=case)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_the_flow_during_training(bench, case, backend, request):
    workdir = start_agent_for(bench, backend, request)
    run_id = bench.server.start_run(backend, **LONG)
    run = bench.wait_for_training(run_id)
    os.kill(run.flow_pid, signal.SIGKILL)
    bench.wait_for_end(run_id, 90)
    bench.verdict("kill -9 the flow during training", run_id, "failed", flow_killed(bench, run_id),
                  started=case, agent_workdir=workdir)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_the_worker_during_training(bench, case, backend, request):
    workdir = start_agent_for(bench, backend, request)
    run_id = bench.server.start_run(backend, **LONG)
    bench.wait_for_training(run_id)
    os.kill(worker_pid(bench, backend, run_id, workdir), signal.SIGKILL)
    run = bench.wait_for_end(run_id, 90)
    bench.verdict("kill -9 the worker during training", run_id, "failed", worker_killed(bench, backend, run_id),
                  started=case, agent_workdir=workdir)
    assert run.state == "failed"


@pytest.mark.parametrize("backend", ["gpu-server", "cluster", "lab"])
def test_kill_the_agent_during_training(bench, case, backend, request):
    workdir = start_agent_for(bench, backend, request)
    run_id = bench.server.start_run(backend, **LONG)
    bench.wait_for_training(run_id)
    os.kill(agent_pid(bench, backend, workdir), signal.SIGKILL)
    bench.wait_for_end(run_id, 90)
    bench.verdict("kill -9 the agent during training", run_id, "failed", agent_killed(bench, backend, run_id),
                  started=case, agent_workdir=workdir)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_potato_start_during_training_and_start_it_again(bench, case, backend, request):
    """The flows live in sessions of their own; the agent backend's agent waits for the server to come back."""
    workdir = start_agent_for(bench, backend, request)
    run_id = bench.server.start_run(backend, epochs=12)
    bench.wait_for_training(run_id)
    bench.server.kill()
    bench.server.start()
    bench.wait_for_end(run_id, 180)
    bench.verdict("kill -9 potato start during training (restarted)", run_id, "succeeded", None,
                  started=case, agent_workdir=workdir)
