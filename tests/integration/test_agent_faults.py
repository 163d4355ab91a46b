"""The real agent against a server that misbehaves on purpose.

The agent (``python -m potato.training.agent --server …``) and its worker are
real; the server is a scripted peer speaking docs/agent-protocol.md. Each case
here is an answer the real ``potato start`` never gives — a claim the agent
must refuse, a bundle it must not unpack (a link, a setuid file), a 503 when
the run store is busy, a 400 naming one event of a batch — so the agent's
side of the contract can only be tested against a peer that gives it. What a
real server and a real network do to the agent (a restart, a cut or
black-holed link, a run that ended: 409) is in tests/faults/, against the
real ``potato start``.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

from potato.bundle.build import build_bundle
from potato.bundle.pack import pack_bundle
from potato.config import load_config
from tests.support.claims import make_claim
from tests.support.runs import process_alive, processes_matching, tiny_project, wait_for

pytestmark = [pytest.mark.training]

TOKEN = "agent-token-for-the-test"
REPO = Path(__file__).resolve().parents[2]


class ScriptedServer:
    """Answers one claim with ``claim``; events with ``on_events(batch)``; records everything else."""

    def __init__(self, claim: dict, bundle: bytes | None = None,
                 on_events: Callable[[list], tuple[int, dict, dict]] | None = None):
        self.claim, self.bundle = claim, bundle
        self.on_events = on_events or (lambda batch: (200, {"cancel": False}, {}))
        self.batches: list[tuple[int, list]] = []  # (status answered, batch)
        self.results: list[dict] = []
        self.predictions: bytes | None = None
        self.claimed = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_GET(self):
                if self.path.endswith("bundle.tar.gz") and server.bundle is not None:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(server.bundle)))
                    self.end_headers()
                    self.wfile.write(server.bundle)
                else:
                    self._send(404, {"error": f"No bundle at {self.path}"})

            def do_PUT(self):
                server.predictions = self._body()
                self._send(200, {"bytes": len(server.predictions)})

            def do_POST(self):
                body = json.loads(self._body() or b"{}")
                if self.path.endswith("/claim"):
                    job, server.claimed = (None if server.claimed else server.claim), True
                    self._send(200, {"job": job, "poll_interval_s": 0.2, "protocol": 1})
                elif self.path.endswith("/events"):
                    status, answer, headers = server.on_events(body["events"])
                    server.batches.append((status, body["events"]))
                    self._send(status, answer, headers)
                elif self.path.endswith("/result"):
                    server.results.append(body)
                    self._send(200, {"recorded": True})
                else:
                    self._send(404, {"error": "no such route"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def start_agent(tmp_path):
    """Start the real agent (``--once``) against a scripted server; whatever it left running goes at teardown."""
    started = []

    def start(server: ScriptedServer, workdir: Path, log: Path) -> subprocess.Popen:
        env = dict(os.environ, POTATO_TRAINING_TOKEN=TOKEN, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
        with open(log, "wb") as out:
            started.append(subprocess.Popen(
                [sys.executable, "-m", "potato.training.agent", "--server", server.url, "--backend", "lab",
                 "--once", "--workdir", str(workdir)], env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True))
        return started[-1]

    yield start
    for pid in [p.pid for p in started if p.poll() is None] + processes_matching(str(tmp_path)):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def served():
    servers = []

    def serve(claim: dict, **kwargs) -> ScriptedServer:
        servers.append(ScriptedServer(claim, **kwargs))
        return servers[-1]

    yield serve
    for server in servers:
        server.close()


@pytest.fixture(scope="module")
def real_bundle(tmp_path_factory):
    """A real bundle of a tiny project, packed as the server packs it, and the trainer's options."""
    root = tmp_path_factory.mktemp("agent-faults")
    cfg = load_config(tiny_project(root, n_items=40))
    build_bundle(cfg, ["sentiment"], root / "bundle")
    packed = pack_bundle(root / "bundle", root / "bundle.tar.gz").read_bytes()
    return packed, dict(cfg.model_training.trainers["hf-text-classification"])


# ------------------------------------------------------------------ item 2: the claim and the bundle


@pytest.mark.parametrize("run_id", ["../../../victim", "VICTIM", -1, 0, True, "7", 2 ** 64])
def test_a_claim_with_a_bad_run_id_touches_nothing(served, start_agent, tmp_path, run_id):
    victim = tmp_path / "victim"  # where <workdir>/jobs/<run_id> points for "../../../victim" and its absolute path
    (victim / "precious").mkdir(parents=True)
    run_id = str(victim) if run_id == "VICTIM" else run_id
    workdir = tmp_path / "work" / "agent"
    workdir.mkdir(parents=True)
    server = served(make_claim(run_id))
    agent = start_agent(server, workdir, tmp_path / "agent.log")
    assert agent.wait(timeout=60) == 2
    log = (tmp_path / "agent.log").read_text()
    assert f"the server sent a job this agent will not take: run_id is {str(run_id)!r}; " \
           "expected a positive whole number" in log
    assert "Traceback" not in log
    assert (victim / "precious").is_dir()  # nothing removed
    assert not (workdir / "jobs").exists() and server.results == []


@pytest.mark.parametrize("field, value, said", [
    ("bundle_url", "http://elsewhere.example/x.tar.gz", "bundle_url is 'http://elsewhere.example/x.tar.gz'"),
    ("bundle_sha256", "not-hex", "bundle_sha256 is 'not-hex'; expected 64 hexadecimal digits"),
    ("grace_seconds", float("nan"), "grace_seconds is nan; expected a number of seconds"),
    ("job", {"run_id": 8, "trainer": "hf-text-classification"}, "job.run_id is 8, not the claim's run_id 7"),
])
def test_a_claim_with_a_bad_field_fails_its_run_cleanly(served, start_agent, tmp_path, field, value, said):
    server = served(make_claim(**{field: value}))
    agent = start_agent(server, tmp_path / "work", tmp_path / "agent.log")
    assert agent.wait(timeout=60) == 0
    log = (tmp_path / "agent.log").read_text()
    assert said in log and "Traceback" not in log
    assert len(server.results) == 1 and server.results[0]["exit_code"] == 1
    assert server.results[0]["error"].startswith("The agent on ") and said in server.results[0]["error"]


def _tar_with(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.addfile(member, io.BytesIO(data) if data else None)
    return buffer.getvalue()


def _symlink_member() -> tarfile.TarInfo:
    info = tarfile.TarInfo("manifest.json")
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return info


def _setuid_member() -> tarfile.TarInfo:
    info = tarfile.TarInfo("items.jsonl")
    info.mode, info.size = 0o4755, 2
    return info


@pytest.mark.parametrize("bundle, said", [
    (None, "could not get the run's bundle: No bundle at /training/agent/v1/runs/7/bundle.tar.gz"),
    (b"this is not a tar.gz", "could not get the run's bundle: ReadError: not a gzip file"),
    (_tar_with(_symlink_member()), "could not get the run's bundle: 'manifest.json': it is a link"),
    (_tar_with(_setuid_member(), b"{}"), "could not get the run's bundle: 'items.jsonl': it has the setuid or setgid bit"),
], ids=["missing", "not a tar", "symlink", "setuid"])
def test_a_bundle_the_agent_cannot_get_fails_the_run_cleanly(served, start_agent, tmp_path, bundle, said):
    server = served(make_claim(), bundle=bundle)
    workdir = tmp_path / "work"
    agent = start_agent(server, workdir, tmp_path / "agent.log")
    assert agent.wait(timeout=60) == 0
    log = (tmp_path / "agent.log").read_text()
    assert "Traceback" not in log
    [result] = server.results
    assert result["exit_code"] == 1 and said in result["error"], result
    bundle_dir = workdir / "jobs/7/bundle"
    assert not any(p.is_symlink() or p.stat().st_mode & 0o6000 for p in bundle_dir.rglob("*"))


# ------------------------------------------------------------------ the contract on events


def test_a_busy_server_and_one_bad_event_lose_nothing_else(served, start_agent, tmp_path, real_bundle):
    packed, options = real_bundle
    stored: list[int] = []
    answered = {"busy": 0, "refused": False}

    def on_events(batch):
        seqs = [e["seq"] for e in batch if "seq" in e]
        if seqs and answered["busy"] < 2:  # the store is busy twice: nothing stored
            answered["busy"] += 1
            return 503, {"error": "The run store is busy; try again"}, {"Retry-After": "1"}
        if 3 in seqs and not answered["refused"]:  # event 3 is bad: what came before it was stored
            answered["refused"] = True
            stored.extend(s for s in seqs if s < 3 and s not in stored)
            return 400, {"error": "events[2].device_name must be a string", "seq": 3,
                         "last_seq": max(stored, default=0)}, {}
        stored.extend(s for s in seqs if s not in stored)
        return 200, {"cancel": False, "last_seq": max(stored, default=0)}, {}

    server = served(make_claim(options=options, bundle_bytes=len(packed),
                               job=dict(make_claim()["job"], options=dict(options, epochs=2))),
                    bundle=packed, on_events=on_events)
    workdir = tmp_path / "work"
    agent = start_agent(server, workdir, tmp_path / "agent.log")
    assert agent.wait(timeout=240) == 0, (tmp_path / "agent.log").read_text()
    written = [json.loads(line)["seq"] for line in (workdir / "jobs/7/events.jsonl").read_text().splitlines()]
    assert stored == [s for s in written if s != 3]  # every other event, once, in order
    log = (tmp_path / "agent.log").read_text()
    assert "the server did not take events (The run store is busy; try again); keeping" in log
    assert ("the server refused event 3 (events[2].device_name must be a string); dropping it and "
            "sending the rest again") in log
    [result] = server.results
    assert result["exit_code"] == 0 and result["scores"]["sentiment"]["n"] > 0
    assert server.predictions and server.predictions.count(b"\n") == 40


def test_a_run_the_server_calls_over_stops_the_worker_which_never_saw_the_token(served, start_agent, tmp_path, real_bundle):
    packed, options = real_bundle
    seen: dict[str, Any] = {}

    def on_events(batch):
        if any(e.get("type") == "progress" and e.get("step", 0) > 0 for e in batch):
            pid = int((workdir / "jobs/7/worker.pid").read_text())
            seen["pid"], seen["environ"] = pid, Path(f"/proc/{pid}/environ").read_bytes()
            return 409, {"error": "Run 7 is not running (cancelled); this token is no longer valid"}, {}
        return 200, {"cancel": False}, {}

    server = served(make_claim(job=dict(make_claim()["job"], options=dict(options, epochs=100000))),
                    bundle=packed, on_events=on_events)
    workdir = tmp_path / "work"
    agent = start_agent(server, workdir, tmp_path / "agent.log")
    assert agent.wait(timeout=180) == 0, (tmp_path / "agent.log").read_text()
    assert "pid" in seen
    wait_for(lambda: not process_alive(seen["pid"]), 10, "the worker to be gone")
    assert b"POTATO_TRAINING_TOKEN" not in seen["environ"] and TOKEN.encode() not in seen["environ"]
    assert ("the server says the run is over for this agent (409 Run 7 is not running (cancelled); this token "
            "is no longer valid); stopping the worker") in (tmp_path / "agent.log").read_text()
    assert server.results == []  # nothing more is sent for a run that is over


def test_a_workdir_the_agent_cannot_write_is_named_before_it_claims(served, start_agent, tmp_path):
    # Under a regular file: not a directory for any user, root included (CI runs as root).
    (tmp_path / "a-file").write_text("")
    workdir = tmp_path / "a-file" / "agent"
    server = served(make_claim(7))
    agent = start_agent(server, workdir, tmp_path / "agent.log")
    assert agent.wait(timeout=60) == 2
    log = (tmp_path / "agent.log").read_text()
    assert f"potato-agent: cannot use --workdir {workdir}: Not a directory. Fix: pass --workdir a directory " \
           "this user can create and write to (e.g. --workdir ~/potato-training)" in log
    assert "Traceback" not in log
    assert not server.claimed and server.results == []
