"""Resources that run out or refuse : a full disk, an unwritable remote_dir, a hung nvidia-smi.

The full disk is a small tmpfs mounted on the run's directory before the run
starts, filled up once the worker trains (another job filling a shared disk;
for the agent backend once the agent has claimed the run), so that the model,
or for the agent backend the predictions, no longer fit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from potato.errors import DiskFull
from tests.faults.test_kills import LONG, start_agent_for

pytestmark = [pytest.mark.sshd, pytest.mark.slurm, pytest.mark.prefect, pytest.mark.training]


@contextmanager
def small_disk(directory: Path):
    """A 4 MB tmpfs on *directory* (root only), unmounted afterwards with what was written there."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(directory)], check=True)
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill(directory: Path, leave: int) -> None:
    """Fill *directory*'s filesystem until *leave* bytes are free (another process's big file)."""
    free = shutil.disk_usage(directory).free
    with open(directory / "somebody-elses-file", "wb") as fh:
        fh.truncate(0)
        fh.write(b"\0" * max(free - leave, 0))


@pytest.mark.parametrize("backend", ["local", "gpu-server", "cluster", "lab"])
def test_the_disk_of_the_run_directory_fills_up(bench, case, backend, request, many_items):
    workdir = start_agent_for(bench, backend, request)
    run_id = (bench.store.list_runs(limit=1) or [None])[0]
    run_dir = bench.run_dir((run_id.id if run_id else 0) + 1)
    more, saved = bench.root / "data" / "more.jsonl", bench.root / "more.jsonl.saved"
    if backend == "lab":  # the model stays with the agent: its predictions (~130 kB) are what must not fit
        os.replace(more, saved)
        shutil.copyfile(many_items, more)
    try:
        with small_disk(run_dir):
            # A local worker writes straight into the run directory: it trains until the disk is full
            # (its events, then, cannot be written: however fast it trains, it fails on the full disk);
            # the others' runs are short, and their disk fills before the copy back.
            run_id = bench.server.start_run(backend, **(LONG if backend == "local" else {}))
            assert bench.run_dir(run_id) == run_dir
            if backend == "lab":  # its events come in 1 s batches, after which it may have uploaded already
                bench.wait_for_event(run_id, lambda e: "claimed the run" in str(e.data.get("message")), 60,
                                     f"an agent to claim run {run_id}")
            else:
                bench.wait_for_training(run_id)
            fill(run_dir, leave={"local": 4, "lab": 64}.get(backend, 48) * 1024)
            bench.wait_for_end(run_id, 120)
    finally:
        if saved.exists():
            os.replace(saved, more)
    message = str(DiskFull(run_dir))
    if backend == "lab":
        message = f"The server did not take the run's predictions: {message}"
    bench.verdict("disk full in the run directory", run_id, "failed", message, started=case, agent_workdir=workdir,
                  note="a 4 MB tmpfs filled while the worker trained")


@pytest.mark.parametrize("backend", ["readonly", "cluster-readonly"])
def test_an_unwritable_remote_dir_is_named_with_the_fix(bench, case, backend):
    run_id = bench.server.start_run(backend)
    bench.wait_for_end(run_id, 60)
    remote_dir = bench.sshd_service.shared_dir / f"{bench.root.name}-readonly" / "potato-training"
    bench.verdict("unwritable remote_dir", run_id, "failed",
                  f"remote_dir {remote_dir} on 127.0.0.1 is not writable by {bench.sshd_service.user}, and Potato "
                  f"keeps its code and the runs' job directories there. Fix: set the backend's remote_dir to a "
                  f"directory {bench.sshd_service.user} can write (the default is ~/.cache/potato-training)",
                  started=case)


@pytest.mark.parametrize("backend", ["gpu-hung", "cluster-hung"])
def test_a_hung_nvidia_smi(bench, case, backend, fake_gpus):
    """ssh: the probe gives up on it after 30 s with a message; slurm: the login node's is never asked."""
    fake_gpus([{"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920, "memory_used": 0,
                "memory_free": 81920, "utilization_gpu": 0, "compute_cap": "8.0"}])
    run_id = bench.server.start_run(backend)
    bench.wait_for_end(run_id, 120)
    if backend == "gpu-hung":
        bench.verdict("nvidia-smi hangs", run_id, "failed",
                      "nvidia-smi on 127.0.0.1 did not answer within 30 s, so Potato cannot tell which GPU is free "
                      "(a hung GPU driver?). Fix: check the host's GPUs (`ssh 127.0.0.1 nvidia-smi` must answer), or "
                      "set the backend's gpus to none to train on its CPU", started=case)
    else:
        bench.verdict("nvidia-smi hangs", run_id, "succeeded", None, started=case,
                      note="jobs get GPUs from gres; the probe does not run nvidia-smi on a login node")
