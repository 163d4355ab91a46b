"""SLURM's own verdicts on the real scheduler, each named with its reason as the run's error words it.

The test SLURM (tests/services/slurm.conf.in) is this session's own: one node,
partitions ``debug`` (PreemptMode=CANCEL), ``requeue`` (REQUEUE) and
``urgent`` (a higher tier that preempts both), memory enforced by slurmstepd
(OverMemoryKill). A node set down is set back to ``resume`` whatever happens,
so no later test finds the cluster broken.
"""

from __future__ import annotations

import re

import pytest

from tests.faults.test_kills import LONG
from tests.support.runs import wait_for

pytestmark = [pytest.mark.sshd, pytest.mark.slurm, pytest.mark.prefect, pytest.mark.training]


def job_of(bench, run_id: int) -> str:
    return wait_for(lambda: (m := re.search(r"Submitted SLURM job (\d+)", bench.run_log(run_id))) and m.group(1),
                    60, "the job to be submitted")


def ended(job: str, reason: str) -> str:
    return f"SLURM job {job} ended before the worker finished: {reason}"


def scontrol_job(slurm_service, job: str) -> dict[str, str]:
    out = slurm_service.run("scontrol", "show", "job", job).stdout
    return dict(word.split("=", 1) for word in out.split() if "=" in word)


def training_job(bench, backend: str = "cluster") -> tuple[int, str]:
    run_id = bench.server.start_run(backend, **LONG)
    bench.wait_for_training(run_id)
    return run_id, job_of(bench, run_id)


def test_node_failure(bench, case, slurm_service):
    run_id, job = training_job(bench)
    node = slurm_service.node
    try:
        done = slurm_service.run("scontrol", "update", f"nodename={node}", "state=down", "reason=potato-fault-test")
        assert done.returncode == 0, done.stderr
        bench.wait_for_end(run_id, 90)
    finally:
        slurm_service.run("scontrol", "update", f"nodename={node}", "state=resume")
        wait_for(lambda: set(slurm_service.run("sinfo", "-h", "-N", "-o", "%T").stdout.split()) == {"idle"}, 30,
                 f"node {node} to be idle again")
    bench.verdict("SLURM node failure", run_id, "failed", ended(job, "its node failed"), started=case)


@pytest.mark.parametrize("backend, mode", [("cluster", "CANCEL"), ("cluster-requeue", "REQUEUE")])
def test_preemption_by_a_higher_priority_partition(bench, case, slurm_service, backend, mode):
    run_id, job = training_job(bench, backend)
    urgent = slurm_service.run("sbatch", "--parsable", "--partition=urgent", "--exclusive", "--output=/dev/null",
                               "--wrap", "sleep 1")
    assert urgent.returncode == 0, urgent.stderr
    bench.wait_for_end(run_id, 90)
    slurm_service.wait_idle()
    # Preempted in a REQUEUE partition, the job was not requeued: job.sh says --no-requeue, one run is one job.
    assert scontrol_job(slurm_service, job).get("Restarts") == "0"
    assert [e.kind for e in bench.store.events(run_id)].count("started") == 1
    bench.verdict(f"SLURM preemption ({mode} partition)", run_id, "failed",
                  ended(job, "it was preempted by a job of higher priority"), started=case)


def test_a_job_an_admin_requeues_is_not_run_twice(bench, case, slurm_service):
    run_id, job = training_job(bench)
    for argv in (("scontrol", "update", f"jobid={job}", "Requeue=1"), ("scontrol", "requeue", job)):
        done = slurm_service.run(*argv)
        assert done.returncode == 0, (argv, done.stderr)
    bench.wait_for_end(run_id, 90)
    assert [e.kind for e in bench.store.events(run_id)].count("started") == 1
    bench.verdict("SLURM job requeued by an admin", run_id, "failed",
                  f"SLURM job {job} was requeued by the scheduler after it had started; Potato runs a run's worker "
                  f"once, so it cancelled the job", started=case)


def test_out_of_memory(bench, case):
    run_id = bench.server.start_run("cluster-small")
    bench.wait_for_end(run_id, 90)
    job = job_of(bench, run_id)
    bench.verdict("SLURM out of memory", run_id, "failed", ended(job, "it ran out of memory (raise the backend's mem)"),
                  started=case, note="mem: 150M; slurmstepd's OverMemoryKill (cgroup v1 enforcement: see the module)")


def test_scancel_from_outside(bench, case, slurm_service):
    run_id, job = training_job(bench)
    slurm_service.run("scancel", job)
    bench.wait_for_end(run_id, 90)
    bench.verdict("scancel from outside Potato", run_id, "failed",
                  ended(job, "it was cancelled with scancel outside Potato"), started=case)


@pytest.mark.slow
def test_time_limit(bench, case):
    run_id = bench.server.start_run("cluster-timed", **LONG)  # time: 1 minute; SLURM ends it after 60-90 s
    bench.wait_for_end(run_id, 240)
    job = job_of(bench, run_id)
    bench.verdict("SLURM time limit", run_id, "failed", ended(job, "it reached its time limit"), started=case)
