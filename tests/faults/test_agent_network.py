"""The agent's link to the server as a home network makes it : cut, black-holed, slow.

A real TCP proxy (``tests.support.tcp_proxy``) sits between the real
``potato training agent`` and the real ``potato start``:

- the bundle download is cut after 500 bytes of each answer, five times: the
  agent resumes with ``Range`` each time and trains on a bundle byte for byte
  the server's; cut a sixth time, the run fails saying so;
- the link goes black during training (packets dropped: requests hang): the
  agent stops its own worker after its ``--offline-limit`` (5 s here; 300 s
  by default), long before the server gives up on it;
- every chunk is held a second each way: posts arrive late, the heartbeat is
  still satisfied, and the run succeeds.
"""

from __future__ import annotations

import io
import re
import tarfile
import time

import pytest

from tests.faults.test_kills import LONG, agent_workdir
from tests.support.runs import processes_matching, wait_for

pytestmark = [pytest.mark.prefect, pytest.mark.training, pytest.mark.sshd, pytest.mark.slurm]

CUT_AFTER = 500


def _is_bundle_download(first: bytes) -> bool:
    return first.startswith(b"GET ") and b"/bundle.tar.gz" in first.split(b"\r\n", 1)[0]


def _server_bundle(bench, run_id: int) -> bytes:
    """The bundle as the server serves it, read while the run is active (clean-up removes it)."""
    bench.wait_for_event(run_id, lambda e: e.kind == "claimed", 60, "an agent to claim the run")
    return (bench.run_dir(run_id) / "bundle.tar.gz").read_bytes()


def test_a_bundle_download_cut_five_times_resumes_to_the_same_bytes(bench, case, request):
    workdir = agent_workdir(bench, request)
    bench.agent_proxy.cut_after(CUT_AFTER, times=5, when=_is_bundle_download)
    agent = bench.start_agent(workdir, "--once", "--keep")
    run_id = bench.server.start_run("lab")
    served = _server_bundle(bench, run_id)
    bench.wait_for_end(run_id, 180)
    assert agent.wait(timeout=60) == 0
    log = (workdir.parent / f"{workdir.name}.log").read_text()
    resumed = re.findall(r"bundle download interrupted \(the connection closed after \d+ of \d+ bytes\); "
                         r"resuming in \d+ s, try (\d) of 5", log)
    assert resumed == ["1", "2", "3", "4", "5"], log
    with tarfile.open(fileobj=io.BytesIO(served), mode="r:gz") as tar:  # what the agent trained on: byte for byte
        for member in tar.getmembers():
            if member.isfile():
                assert (workdir / "jobs" / str(run_id) / "bundle" / member.name).read_bytes() == \
                    tar.extractfile(member).read(), member.name
    bench.verdict("agent link cut 5 times during the bundle download", run_id, "succeeded", None, started=case,
                  agent_workdir=workdir, note=f"resumed 5 times with Range ({len(served)} bytes, identical)")


def test_a_bundle_download_cut_a_sixth_time_fails_the_run_saying_so(bench, case, request):
    workdir = agent_workdir(bench, request)
    bench.agent_proxy.cut_after(CUT_AFTER, times=6, when=_is_bundle_download)
    agent = bench.start_agent(workdir, "--once")
    run_id = bench.server.start_run("lab")
    run = bench.wait_for_end(run_id, 120)
    assert agent.wait(timeout=60) == 0
    said = re.fullmatch(r"The agent on \S+ could not get the run's bundle: the download was cut off 6 times \(the "
                        r"agent resumes it at most 5 times\); the last time: the connection closed after \d+ of \d+ "
                        r"bytes", run.error or "")
    assert said, run.error
    bench.verdict("agent link cut 6 times during the bundle download", run_id, "failed", run.error, started=case,
                  agent_workdir=workdir)


def test_a_black_holed_agent_stops_its_own_worker_after_its_offline_limit(bench, case, request):
    workdir = agent_workdir(bench, request)
    agent = bench.start_agent(workdir, "--once", "--offline-limit", "5")
    run_id = bench.server.start_run("lab", **LONG)
    bench.wait_for_training(run_id)
    bench.agent_proxy.blackhole()
    holed = time.monotonic()
    log = workdir.parent / f"{workdir.name}.log"
    wait_for(lambda: "no contact with the server for 5 s" in log.read_text(), 30, "the agent to give up")
    wait_for(lambda: processes_matching(str(workdir / "jobs")) == [], 30, "the agent to stop its worker")
    stopped_after = time.monotonic() - holed
    assert agent.wait(timeout=30) == 0
    assert bench.store.get_run(run_id).state == "running"  # the server still waits for word from it
    bench.wait_for_end(run_id, 60)
    bench.agent_proxy.heal()
    bench.verdict("agent link black-holed during training", run_id, "failed",
                  "No word from the agent on lab for 20 seconds", started=case, agent_workdir=workdir,
                  note=f"the agent stopped its worker itself {stopped_after:.0f} s after the link went dark "
                       "(--offline-limit 5)")


def test_delayed_posts_still_keep_the_run_alive(bench, case, request):
    workdir = agent_workdir(bench, request)
    bench.agent_proxy.delay(1.0)  # each chunk, each way: every request takes 2 s or more
    bench.start_agent(workdir, "--once")
    run_id = bench.server.start_run("lab", epochs=6)
    bench.wait_for_end(run_id, 240)
    bench.agent_proxy.heal()
    bench.verdict("agent posts delayed", run_id, "succeeded", None, started=case, agent_workdir=workdir,
                  note="every chunk held 1 s each way; heartbeat_timeout_s 20")
