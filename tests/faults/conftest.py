"""The fault suite's one project, served by one real ``potato start``, with the network between the parts.

Every case of tests/faults/ runs on this project (``bench``): one server, one
Prefect concurrency limit, one queue, so each case's run is the next queued
run of the case before it. Its backends:

- ``local``;
- ``gpu-server`` (ssh) and ``cluster`` (slurm: ``debug`` partition), reached
  through ``ssh_proxy``, a TCP proxy in front of the real sshd that a case can
  cut, black-hole or slow down; ``cluster-requeue`` (the ``requeue``
  partition), ``cluster-small`` (``mem: 150M``) and ``cluster-timed``
  (``time: 1``) beside it; ``gpu-hung``
  and ``cluster-hung`` (the fake nvidia-smi hangs), ``readonly``/``cluster-readonly`` (a
  ``remote_dir`` the host's account cannot write);
- ``lab`` (agent): ``potato training agent`` reaches the server through
  ``agent_proxy``.

The queue case runs last: it is also the proof that after all the faults
every backend's next run starts and succeeds.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.faults import open_bench

LAST = ("test_queue.py",)


def pytest_collection_modifyitems(items):
    """The queue case last of the fault cases (it checks that every backend's next run succeeds after them).

    The hook sees the whole session's items: only the fault cases are reordered, in place.
    """
    here = Path(__file__).parent
    places = [k for k, item in enumerate(items) if item.path.parent == here]
    ordered = sorted((items[k] for k in places), key=lambda item: item.path.name in LAST)
    for k, item in zip(places, ordered):
        items[k] = item


@pytest.fixture(scope="session")
def bench(prefect_api, sshd_service, slurm_service, ssh_proxy, shared_model, tmp_path_factory):
    with open_bench(tmp_path_factory.mktemp("faults"), (sshd_service, slurm_service), ssh_proxy,
                    shared_model) as bench:
        yield bench


@pytest.fixture(scope="session")
def many_items(bench):
    """1500 items nobody labelled, to put in place of data/more.jsonl: predictions of ~130 kB."""
    path = bench.root / "many.jsonl"
    path.write_text("".join(f'{{"id": "u{i}", "text": "not labelled yet, item {i}"}}\n' for i in range(1500)))
    return path


@pytest.fixture
def case(bench):
    """Each case starts with a healthy network and ends with every agent it started stopped."""
    bench.ssh_proxy.heal()
    bench.agent_proxy.heal()
    started = time.monotonic()
    yield started
    bench.ssh_proxy.heal()
    bench.agent_proxy.heal()
    bench.stop_agents()
