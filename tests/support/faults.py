"""What every fault case of tests/faults/ checks, and the record the fault matrix is printed from.

One project with every kind of backend is served by one real ``potato start``
for the whole fault suite (``FaultBench``); each case starts a run through
the admin API, does its damage, waits for the run's end and calls
``FaultBench.verdict``, which asserts, the same way for every case:

- the run's final state and its error, word for word;
- nothing left behind: no process of the project on this machine (but the
  server), none of the run's ssh processes or sockets here, no process of this
  test session on the ssh host (which is the SLURM node too), no job in
  ``squeue``, no remote job directory, socket or half-copied code, no
  process of the agent's job on the agent's machine, no slot held in the
  project's Prefect concurrency limit;
- the annotators' files (their ``user_state.json`` and the data files) are
  byte for byte what they were when the suite started;

and appends one line to ``test-artifacts/faults.jsonl``, which
``python -m tests.faults.matrix`` prints as the matrix. The next run a case
starts is "the next queued run" of the case before it: it starts only once
the one before has ended with everything stopped (the one-run rule), and
each backend's group of cases ends with a run that succeeds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from potato.config import load_config
from potato.runs.prefect_runs import limit_name
from potato.runs.store import Run, Store
from tests.support.potato_project import item_text, make_project, true_label, write_items
from tests.support.remote_host import host_processes
from tests.support.runs import (
    POTATO,
    free_port,
    potato,
    processes_matching,
    stop_group,
    store_of,
    wait_for,
    wait_for_state,
)
from tests.support.tcp_proxy import TcpProxy

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "test-artifacts" / "faults.jsonl"
ENDED = ("succeeded", "failed", "cancelled")
API_KEY = "test-admin-key"


def record(fault: str, backend: str, kind: str, run: Run | None, *, seconds: float, leftovers: str = "none",
           note: str = "") -> None:
    """Append one case's outcome to ``test-artifacts/faults.jsonl`` (the matrix reads the newest per cell).

    *backend* is the backend's name, *kind* its type (the matrix's column).
    """
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    entry = {"fault": fault, "backend": backend, "type": kind, "state": run.state if run else None,
             "message": run.error if run else None, "leftovers": leftovers, "seconds": round(seconds, 1),
             "note": note, "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    with open(RECORD, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def file_hashes(paths: list[Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


class PotatoServer:
    """The real ``potato start`` of the fault project, on a fixed port; kill -9 and start again at will."""

    def __init__(self, config: Path, port: int, log: Path):
        self.config, self.port, self.log = config, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen([POTATO, "start", str(self.config), "--port", str(self.port)], env=env,
                                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        wait_for(self._up, 90, f"potato start to serve on port {self.port}")

    def _up(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()[-3000:]
        try:
            return urllib.request.urlopen(self.url + "/admin/training/login", timeout=2).status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server process alone (a crash: the flows it started live in sessions of their own)."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process, 60)

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + "/admin/training/api/" + path, data=data, method=method,
                                         headers={"X-API-Key": API_KEY, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def start_run(self, backend: str, **options: Any) -> int:
        status, body = self.api("POST", "runs", {"trainer": "hf-text-classification", "schemas": ["sentiment"],
                                                 "backend": backend, "options": options})
        assert status == 201, body
        return body["run"]["id"]


@dataclass
class FaultBench:
    """The fault suite's project, its server, the network between the parts, and the checks of every case."""

    root: Path
    config: Path
    store: Store
    server: PotatoServer
    limit_name: str
    annotator_files: dict[str, str]
    sshd_service: Any
    slurm_service: Any
    ssh_proxy: Any                     # between this machine's ssh and the host's sshd
    agent_proxy: Any                   # between the agent and `potato start`
    remote_dirs: dict[str, Path]       # backend name -> its remote_dir on the host
    agent_token: str
    types: dict[str, str]              # backend name -> type
    agents: list[subprocess.Popen] = field(default_factory=list)

    # -------------------------------------------------------------- runs
    def run_dir(self, run_id: int) -> Path:
        return self.root / "annotation_output" / "training" / "runs" / str(run_id)

    def run_log(self, run_id: int) -> str:
        path = self.run_dir(run_id) / "run.log"
        return path.read_text() if path.exists() else ""

    def wait_for_event(self, run_id: int, test, timeout: float, what: str):
        return wait_for(lambda: next((e for e in self.store.events(run_id) if test(e)), None), timeout, what,
                        interval=0.02)

    def wait_for_training(self, run_id: int, timeout: float = 120) -> Run:
        self.wait_for_event(run_id, lambda e: e.kind == "progress" and (e.data.get("step") or 0) > 0, timeout,
                            f"run {run_id} to report training progress")
        return self.store.get_run(run_id)

    def wait_for_end(self, run_id: int, timeout: float = 120) -> Run:
        return wait_for_state(self.store, run_id, ENDED, timeout)

    def start_agent(self, workdir: Path, *extra: str) -> subprocess.Popen:
        """``potato training agent`` for the agent backend, through the agent proxy."""
        env = dict(os.environ, POTATO_TRAINING_TOKEN=self.agent_token, HF_HUB_OFFLINE="1")
        workdir.mkdir(parents=True, exist_ok=True)
        with open(workdir.parent / f"{workdir.name}.log", "ab") as out:
            agent = subprocess.Popen(
                [POTATO, "training", "agent", "--server", f"http://127.0.0.1:{self.agent_proxy.port}",
                 "--backend", "lab", "--workdir", str(workdir), *extra], env=env, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.agents.append(agent)
        return agent

    def stop_agents(self) -> None:
        for agent in self.agents:
            stop_group(agent, 30)
        self.agents.clear()

    # -------------------------------------------------------------- the checks of every case
    def verdict(self, fault: str, run_id: int, state: str, message: str | None, *,
                started: float, agent_workdir: Path | None = None, note: str = "") -> Run:
        """Assert the run's end and that nothing is left behind; record the case for the matrix."""
        run = self.store.get_run(run_id)
        assert (run.state, run.error) == (state, message), f"{(run.state, run.error)!r}\n{self.run_log(run_id)[-4000:]}"
        self.assert_nothing_left(run_id, agent_workdir=agent_workdir)
        record(fault, run.backend, self.types[run.backend], run, seconds=time.monotonic() - started, note=note)
        return run

    def assert_nothing_left(self, run_id: int, *, agent_workdir: Path | None = None) -> None:
        log = self.run_log(run_id)
        server_pid = self.server.process.pid if self.server.process else None
        wait_for(lambda: self._local_leftovers(server_pid) == [], 20,
                 f"no process of the project left on this machine: {self._local_leftovers(server_pid)}")
        for sock in re.findall(r"\(reverse forward (\S+)\)", log):
            assert processes_matching(sock) == [], f"ssh processes of run {run_id} are left here"
            assert not Path(sock).exists(), f"the run's socket {sock} is left on the host"
        for local in re.findall(r"the run's protocol socket here is (\S+)", log):
            assert not Path(local).parent.exists(), f"the run's protocol socket directory {local} is left here"
        wait_for(lambda: host_processes(self.sshd_service) == [], 20,
                 f"no Potato process left on the host: {host_processes(self.sshd_service)}")
        for job_dir in re.findall(r"Started the agent in (\S+) on ", log):
            assert not Path(job_dir).exists(), f"the remote job directory {job_dir} is left on the host"
        for name, remote_dir in self.remote_dirs.items():
            jobs = remote_dir / "jobs"
            assert not jobs.exists() or list(jobs.iterdir()) == [], f"{name}: {list(jobs.iterdir())} left in {jobs}"
            code = remote_dir / "code"
            half = lambda: [p.name for p in code.glob(".tmp-*")] if code.exists() else []  # noqa: E731
            # The host removes a cut copy once its end of the connection sees it cut: the proxy may
            # still be handing it the bytes it buffered when the flow died.
            wait_for(lambda: half() == [], 30, f"{name}: half-copied code {half()} left in {code}")
        wait_for(lambda: self._squeue() == "", 30, f"squeue to list no job of the test user: {self._squeue()}")
        if agent_workdir is not None:
            wait_for(lambda: processes_matching(str(agent_workdir / "jobs")) == [], 20,
                     "no process of the agent's job left on the agent's machine")
        wait_for(lambda: self.held_slots() == 0, 20, f"the Prefect concurrency limit {self.limit_name} to be free")
        assert file_hashes([Path(p) for p in self.annotator_files]) == self.annotator_files, \
            "an annotator's file changed"

    def _local_leftovers(self, server_pid: int | None) -> list[str]:
        found = []
        for pid in processes_matching(str(self.root)):
            if pid == server_pid or pid in (a.pid for a in self.agents if a.poll() is None):
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            found.append(f"{pid}: {cmdline[:300]}")
        return found

    def _squeue(self) -> str:
        return self.slurm_service.run("squeue", "--noheader", "--user", self.slurm_service.user,
                                      "--format", "%i %T").stdout.strip()

    def held_slots(self) -> int:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            try:
                return client.read_global_concurrency_limit_by_name(self.limit_name).active_slots
            except Exception:  # not created yet: nothing held
                return 0


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
def open_bench(root: Path, services, ssh_proxy: TcpProxy, model: Path, *, prepare=None,
               **model_training) -> Iterator[FaultBench]:
    """A fault project under *root* with its own ``potato start`` and agent proxy; the ssh proxy is shared.

    *prepare*: called with the project's config.yaml before anything reads it (another schema, say)."""
    sshd_service, slurm_service = services
    remote_dirs = {name: sshd_service.shared_dir / f"{root.name}-{name}" for name in ("gpu-server", "cluster")}
    readonly = sshd_service.shared_dir / f"{root.name}-readonly"  # root's: the ssh user may read, not write
    readonly.mkdir(mode=0o755, exist_ok=True)
    port = free_port()
    agent_proxy = TcpProxy(port, lifetime_s=3600)
    config = _project(root, model, sshd_service, ssh_proxy.port, remote_dirs, readonly, **model_training)
    if prepare is not None:
        prepare(config)
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
