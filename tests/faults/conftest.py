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

import contextlib
import shutil
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from potato.config import load_config
from potato.prefect_runs import limit_name
from tests.support import service_fixtures
from tests.support.faults import FaultBench, PotatoServer, file_hashes
from tests.support.potato_project import item_text, make_project, true_label, write_items
from tests.support.runs import free_port, potato, store_of
from tests.support.tcp_proxy import TcpProxy

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


def _project(root: Path, model: Path, sshd_service, ssh_port: int, remote_dirs: dict[str, Path],
             readonly: Path, **model_training) -> Path:
    login = {"host": "127.0.0.1", "port": ssh_port, "user": sshd_service.user,
             "identity_file": str(sshd_service.identity_file), "python": str(sshd_service.python)}
    slurm = {"type": "slurm", **login, "job_python": str(sshd_service.python), "gres": "gpu:1",
             "poll_interval_s": 1, "remote_dir": str(remote_dirs["cluster"])}
    backends = {
        "gpu-server": {"type": "ssh", **login, "remote_dir": str(remote_dirs["gpu-server"])},
        "gpu-hung": {"type": "ssh", **login, "remote_dir": str(remote_dirs["gpu-server"]),
                     "env": {"FAKE_NVIDIA_SMI_HANG": "1"}},
        "readonly": {"type": "ssh", **login, "remote_dir": str(readonly / "potato-training")},
        "cluster": slurm,
        "cluster-requeue": {**slurm, "partition": "requeue"},
        "cluster-small": {**slurm, "mem": "150M"},
        "cluster-timed": {**slurm, "time": "1"},
        "cluster-hung": {**slurm, "env": {"FAKE_NVIDIA_SMI_HANG": "1"}},
        "cluster-readonly": {**slurm, "remote_dir": str(readonly / "potato-training")},
        "lab": {"type": "agent", "heartbeat_timeout_s": 20},
    }
    options = {"model": str(model), "epochs": 2, "learning_rate": 3e-3, "batch_size": 8, "max_length": 32}
    config = make_project(root, n_items=40, labeled_fraction=0.9, model_training={
        "enabled": True, "max_wall_seconds": 300, "grace_seconds": 2, "heartbeat_timeout_s": 30,
        "writeback": {"schemas": ["sentiment"], "include_unlabeled": True, "min_confidence": 0.5},
        "trainers": {"hf-text-classification": options}, "backends": backends, **model_training})
    # A second data file: the bundle-build case puts a file that never answers (a FIFO) in its place.
    more = root / "data" / "more.jsonl"
    write_items(more, ({"id": f"m{i}", "text": item_text(i, true_label(i))} for i in range(6)), "jsonl")
    data = yaml.safe_load(config.read_text())
    data["data_files"].append("data/more.jsonl")
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    return config


@contextlib.contextmanager
def open_bench(root: Path, services, ssh_proxy: TcpProxy, model: Path, **model_training) -> Iterator[FaultBench]:
    """A fault project under *root* with its own ``potato start`` and agent proxy; the ssh proxy is shared."""
    sshd_service, slurm_service = services
    remote_dirs = {name: sshd_service.shared_dir / f"{root.name}-{name}" for name in ("gpu-server", "cluster")}
    readonly = sshd_service.shared_dir / f"{root.name}-readonly"  # root's: the ssh user may read, not write
    readonly.mkdir(mode=0o755, exist_ok=True)
    port = free_port()
    agent_proxy = TcpProxy(port, lifetime_s=3600)
    config = _project(root, model, sshd_service, ssh_proxy.port, remote_dirs, readonly, **model_training)
    registered = potato("training", "register", "lab", str(config))
    assert registered.returncode == 0, registered.stderr
    cfg = load_config(config)
    annotators = sorted(root.glob("annotation_output/*/user_state.json")) + sorted((root / "data").iterdir())
    server = PotatoServer(config, port, root / "server.log")
    bench = FaultBench(
        root=root, config=config, store=store_of(config), server=server, limit_name=limit_name(cfg),
        annotator_files=file_hashes(annotators), sshd_service=sshd_service, slurm_service=slurm_service,
        ssh_proxy=ssh_proxy, agent_proxy=agent_proxy, remote_dirs=remote_dirs,
        agent_token=registered.stdout.splitlines()[2].strip(),
        types={name: backend.type for name, backend in cfg.model_training.backends.items()})
    server.start()
    try:
        yield bench
    finally:
        bench.stop_agents()
        server.stop()
        agent_proxy.close()
        for directory in [*remote_dirs.values(), readonly]:
            with contextlib.suppress(OSError):
                shutil.rmtree(directory)


@pytest.fixture(scope="session")
def ssh_proxy(sshd_service):
    """The TCP proxy every fault project's ssh and slurm backends log in through (trusted in known_hosts)."""
    proxy = TcpProxy(sshd_service.port, lifetime_s=3600)
    service_fixtures.trust_forwarded_port(sshd_service, proxy.port)
    yield proxy
    proxy.close()
    service_fixtures.untrust_forwarded_ports(sshd_service)


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
