"""stop_job.py, what the server runs on a host to stop a run's leftovers."""

from __future__ import annotations

import subprocess
import sys

from potato.training.stop_job import remove, stop


def test_only_paths_shaped_as_potato_makes_them_are_removed(tmp_path):
    victim = tmp_path / "precious"
    victim.mkdir()
    for job_dir in [str(victim), str(tmp_path), "/", str(tmp_path / "jobs" / "7-0a1b2c3d" / "..")]:
        assert remove({"job_dir": job_dir, "socket": str(victim), "remove": "all"}) == []
    assert victim.is_dir()


def test_a_job_directory_or_only_its_bundle_is_removed(tmp_path):
    job = tmp_path / "jobs" / "7-0a1b2c3d"
    (job / "bundle").mkdir(parents=True)
    (job / "artifacts").mkdir()
    assert remove({"job_dir": str(job), "socket": "", "remove": "none"}) == []
    assert remove({"job_dir": str(job), "socket": "", "remove": "bundle"}) == [str(job / "bundle")]
    assert (job / "artifacts").is_dir() and not (job / "bundle").exists()
    assert remove({"job_dir": str(job), "socket": "", "remove": "all"}) == [str(job)]
    assert not job.exists()


def test_stop_kills_what_names_the_job_and_reports_nothing_left(tmp_path):
    job = tmp_path / "jobs" / "7-0a1b2c3d"
    job.mkdir(parents=True)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(job)],
                              start_new_session=True)
    (job / "worker.pid").write_text(f"{worker.pid}\n")
    try:
        report = stop({"job_dir": str(job), "socket": "", "slurm_job_id": None, "remove": "all", "wait_s": 10})
        assert worker.wait(timeout=5) < 0
    finally:
        worker.kill()
    assert report["left"] == [] and report["slurm"]["gone"] is True
    assert len(report["killed"]) == 1 and str(job) in report["killed"][0]
    assert report["removed"] == [str(job)] and not job.exists()


def test_the_files_it_reads_are_the_ones_the_job_directory_names():
    """stop_job.py runs alone on a host, so it spells the names itself; they must be JobPaths's."""
    from potato.training import job_paths, stop_job

    assert (stop_job.AGENT_PID, stop_job.WORKER_PID, stop_job.SLURM_JOB_ID, stop_job.BUNDLE) == (
        job_paths.AGENT_PID, job_paths.WORKER_PID, job_paths.SLURM_JOB_ID, job_paths.BUNDLE)
