"""20 runs submitted at once through the API and the CLI together  — last, after all the faults.

Ten through ``POST /admin/training/api/runs`` and ten through ``potato
training run --detach``, all let go at the same moment; most on ``local``,
one each on the ssh, slurm and agent backends, so that this is also the
proof that after every fault above each backend's next run starts and
succeeds. The store is sampled every 20 ms meanwhile: never two runs
running. All are recorded, they start in the order they were created
(strictly FIFO), each after the one before has ended, and all succeed.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.faults import record
from tests.support.runs import potato, wait_for

pytestmark = [pytest.mark.sshd, pytest.mark.slurm, pytest.mark.prefect, pytest.mark.training]

BACKENDS = ["local"] * 8 + ["gpu-server", "cluster"] + ["local"] * 9 + ["lab"]


@pytest.mark.slow
def test_twenty_runs_at_once_through_the_api_and_the_cli(bench, case, request):
    bench.start_agent(bench.root / "agents" / "queue")
    before = {run.id for run in bench.store.list_runs()}
    go = threading.Barrier(len(BACKENDS))
    failures: list[str] = []

    def submit(index: int, backend: str) -> None:
        go.wait()
        if index % 2:
            status, body = bench.server.api("POST", "runs", {"trainer": "hf-text-classification",
                                                             "backend": backend, "options": {"epochs": 1}})
            if status != 201:
                failures.append(f"API {status}: {body}")
        else:
            done = potato("training", "run", str(bench.config), "--detach", "--backend", backend,
                          "--option", "epochs=1")
            if done.returncode != 0:
                failures.append(f"CLI {done.returncode}: {done.stdout}{done.stderr}")

    most_running = [0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            most_running[0] = max(most_running[0], sum(r.state == "running" for r in bench.store.active_runs()))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    submitters = [threading.Thread(target=submit, args=(i, b)) for i, b in enumerate(BACKENDS)]
    for thread in submitters:
        thread.start()
    try:
        for thread in submitters:
            thread.join(timeout=120)
        assert failures == []
        ours = lambda: [r for r in bench.store.list_runs() if r.id not in before]  # noqa: E731
        assert len(ours()) == len(BACKENDS)  # all recorded
        wait_for(lambda: all(r.state in ("succeeded", "failed", "cancelled") for r in ours()), 900,
                 "all 20 runs to end", interval=0.5)
    finally:
        sampling.set()
        sampler.join()
    runs = sorted(ours(), key=lambda r: r.id)
    assert most_running[0] == 1, "two runs were running at once"
    assert [r.state for r in runs] == ["succeeded"] * len(BACKENDS), [(r.id, r.backend, r.error) for r in runs]
    assert sorted(r.backend for r in runs) == sorted(BACKENDS)
    for earlier, later in zip(runs, runs[1:]):  # strictly FIFO, one at a time
        assert later.started_at >= earlier.finished_at, (earlier.id, later.id)
    bench.assert_nothing_left(runs[-1].id, agent_workdir=bench.root / "agents" / "queue")
    took = time.monotonic() - case
    for kind in ("local", "ssh", "slurm", "agent"):
        mine = [r for r in runs if bench.types[r.backend] == kind]
        record("20 runs at once (API and CLI)", mine[-1].backend, kind, mine[-1], seconds=took,
               note=f"{len(mine)} of the 20 on this backend; all 20 succeeded, FIFO, never two running "
                    f"(sampled every 20 ms)")
