"""The abuse report: attacks on the server and by annotators, against a live ``potato start``, as a table.

Run by hand, or by tests/integration/test_abuse_report.py::

    .venv/bin/python bench/abuse_report.py           # the table; exit 0 when every row is yes
    .venv/bin/python bench/abuse_report.py --json    # the rows as JSON, for the test

**Clients.** It writes a project into a temporary directory, registers an
agent backend token and starts the real ``potato start`` on a free loopback
port (with ``PREFECT_API_URL``'s Prefect API if set, else the embedded one it
starts itself). A run on the agent backend is started through the admin API,
so its flow really waits for an agent; this script then plays that agent and
every hostile client in turn, with raw sockets and ``http.client``. After
each case it reads the run store and the run directory and says whether
nothing was stored that should not be and nothing was lost that should have
been kept: case -> answer code -> nothing stored/lost (yes/no).

Cases that say "headers only" send a request's headers and never a byte of
the body they announce: an answer at all proves the server decided without
reading it (a server that waited for the body would time out instead).

**Annotators.** Potato 2.12's ``/submit_annotation`` saves a label on any id
an annotator posts, so one annotator can put anything JSON carries into
their ``user_state.json``. A second project (2,000 items, Dawid-Skene
consensus, auto-retraining on its agent backend) is served the same way, and
its annotators' files are written as 2.12 writes them: a label planted on a
lone surrogate and on a 2 MB id, 5,000 planted ids and then the annotator
removed, and an annotator who agrees with the truth except on items they
chose. Each case's answer is what happened (the run's state, what consensus
decided, whether auto-retraining went on) against what should.

**Data providers.** A third project keeps its items in a watched
``data_directory`` with the live writeback on, and this script plays whoever
may write that directory while an agent run is under way: it keeps planting
links to a victim file (an ``authorized_keys``) at every temporary name a
writer with a guessable name would use, links a data file to a dataset
outside the directory, drops in a CSV the run cannot read (a cell past the
csv module's 128 kB), and runs a feed that appends items by the feeds' rule
while the writeback rewrites. Then a fourth project's ``potato start`` is
killed (SIGKILL) between the two files of its first live writeback, and
started again. Each answer is what happened to the victim, the outside
dataset, the run, the fed items and the second start.

**The Hub's credentials.** The third project's server publishes to an
``HF_ENDPOINT`` holding ``user:password``, where a Hub answers 502 with an
empty body; the password must appear nowhere: not in the admin API's
answer, the run page, the run store's bytes or the server's log.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.potato_project import ADMIN_API_KEY as ADMIN_KEY  # noqa: E402  (the generated projects' key)

V1 = "/training/agent/v1"
API = "/admin/training/api"
MIB = 1024 * 1024
ANSWER_WITHIN_S = 10
# potato's store waits this long for a write lock before it answers 503.
BUSY_WAIT_S = 30
POTATO = str(Path(sys.executable).with_name("potato"))


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Row:
    case: str
    expected: int | str
    answer: int | str
    nothing_lost: bool

    @property
    def ok(self) -> bool:
        return self.answer == self.expected and self.nothing_lost


class Server:
    """A live ``potato start`` on the project whose config is *config_path*, and the run store it writes."""

    def __init__(self, root: Path, config_path: Path, env: dict[str, str] | None = None, log_name: str = "server.log"):
        from potato.config import load_config
        from potato.runs.paths import open_store
        from potato.runs.tokens import register_agent

        self.config_path = config_path
        self.config = load_config(self.config_path)
        self.store = open_store(self.config)
        self.token = register_agent(self.config, self.store, "lab-workstation")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = root / log_name
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([POTATO, "start", str(self.config_path), "--port", str(self.port)],
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, **(env or {})})
        wait_for(lambda: self.alive(), 120, "potato start to serve", self)

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"potato start exited with {self.process.returncode}:\n{self.log.read_text()}")
        try:
            return self.request("GET", "/admin/training/login").status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        self.store.close()

    def run_dir(self, run_id: int) -> Path:
        from potato.runs.paths import run_paths

        return run_paths(self.config, run_id).dir

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> Answer:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=BUSY_WAIT_S + 30)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            answer = connection.getresponse()
            return Answer(answer.status, dict(answer.getheaders()), answer.read())
        finally:
            connection.close()

    def headers_only(self, method: str, path: str, headers: dict[str, str]) -> Answer:
        with socket.create_connection(("127.0.0.1", self.port), timeout=ANSWER_WITHIN_S) as sock:
            head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            sock.sendall(head.encode())
            answer = http.client.HTTPResponse(sock)
            try:
                answer.begin()
            except socket.timeout:
                return Answer(0, {}, b"no answer without the body")
            return Answer(answer.status, dict(answer.getheaders()), answer.read())

    def agent(self, method: str, path: str, payload: Any = None, raw: bytes | None = None) -> Answer:
        headers = {"Authorization": f"Bearer {self.token}"}
        body = raw
        if payload is not None:
            body = json.dumps(payload).encode()
        if body is not None and not path.endswith("/predictions"):
            headers["Content-Type"] = "application/json"
        return self.request(method, path, body, headers)

    def admin(self, method: str, path: str, raw: bytes | None = None) -> Answer:
        headers = {"X-API-Key": ADMIN_KEY}
        if raw is not None:
            headers["Content-Type"] = "application/json"
        return self.request(method, path, raw, headers)


def wait_for(condition: Callable[[], Any], timeout: float, what: str, server: Server | None = None,
             interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    log = server.log.read_text()[-3000:] if server else ""
    raise TimeoutError(f"Waited {timeout:g} s for {what}\n{log}")


def strict_json(data: bytes) -> Any:
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")
    return json.loads(data, parse_constant=refuse)


def event(seq: int, **fields: Any) -> dict[str, Any]:
    return {"seq": seq, "t": time.time(), **fields}


def progress(seq: int, step: int, **extra: Any) -> dict[str, Any]:
    return event(seq, type="progress", phase="train", step=step, total=40, epoch=1, loss=0.5, **extra)


PREDICTION = b'{"id": "r1", "schema": "sentiment", "label": "positive", "confidence": 0.9}\n'


# -- the cases: each sends its attack and checks the store; returns (answer code, nothing stored/lost) -------


def start_and_claim(server: Server) -> int:
    """A running agent run, claimed by this script as its agent; its id."""
    body = json.dumps({"trainer": "hf-text-classification", "schemas": ["sentiment"],
                       "backend": "lab-workstation"}).encode()
    created = server.admin("POST", f"{API}/runs", body)
    assert created.status == 201, created.body

    def claimed():
        job = server.agent("POST", f"{V1}/backends/lab-workstation/claim", {"agent": {"host": "abuse-report"}})
        return job.json()["job"]
    job = wait_for(claimed, 120, "the run's flow to offer the run to an agent", server)
    return job["run_id"]


def untouched_predictions(server: Server, run_id: int) -> bool:
    return not [p for p in server.run_dir(run_id).iterdir() if "predictions" in p.name]


def worker_events(server: Server, run_id: int) -> list[str]:
    return [e.kind for e in server.store.events(run_id) if e.data.get("source") != "potato"
            and e.kind in ("started", "log", "progress", "metrics", "done")]


def case_600_mib_upload(server: Server, run_id: int) -> tuple[int, bool]:
    answer = server.headers_only("PUT", f"{V1}/runs/{run_id}/predictions",
                                 {"Authorization": f"Bearer {server.token}", "Content-Length": str(600 * MIB)})
    return answer.status, untouched_predictions(server, run_id)


def case_strangers_upload(server: Server, run_id: int) -> tuple[int, bool]:
    answer = server.headers_only("PUT", f"{V1}/runs/{run_id}/predictions", {"Content-Length": str(600 * MIB)})
    return answer.status, untouched_predictions(server, run_id)


def case_strangers_upload_expecting_continue(server: Server, run_id: int) -> tuple[int, bool]:
    answer = server.headers_only("PUT", f"{V1}/runs/{run_id}/predictions",
                                 {"Content-Length": str(600 * MIB), "Expect": "100-continue"})
    return answer.status, untouched_predictions(server, run_id)


def case_strangers_events(server: Server, run_id: int) -> tuple[int, bool]:
    before = worker_events(server, run_id)  # the flow writes its own step and log events meanwhile
    answer = server.headers_only("POST", f"{V1}/runs/{run_id}/events",
                                 {"Authorization": "Bearer guessed", "Content-Type": "application/json",
                                  "Content-Length": "100000"})
    return answer.status, worker_events(server, run_id) == before


def case_oversized_json(server: Server, run_id: int) -> tuple[int, bool]:
    before = worker_events(server, run_id)  # the flow writes its own step and log events meanwhile
    answer = server.headers_only("POST", f"{V1}/runs/{run_id}/events",
                                 {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json",
                                  "Content-Length": str(2 * MIB)})
    return answer.status, worker_events(server, run_id) == before


def case_chunked_json(server: Server, run_id: int) -> tuple[int, bool]:
    before = worker_events(server, run_id)  # the flow writes its own step and log events meanwhile
    answer = server.headers_only("POST", f"{V1}/runs/{run_id}/events",
                                 {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json",
                                  "Transfer-Encoding": "chunked"})
    return answer.status, worker_events(server, run_id) == before


def case_bad_event_mid_batch(server: Server, run_id: int) -> tuple[int, bool]:
    batch = [event(1, type="started", pid=1, python="3.11.7", device="cpu", device_name="CPU"),
             progress(2, 10), event(3, type="started", device_name={}), progress(4, 20)]
    answer = server.agent("POST", f"{V1}/runs/{run_id}/events", {"events": batch})
    body = answer.json()
    # The agent drops what is stored and the bad one, sends the rest: every good event once.
    retry = server.agent("POST", f"{V1}/runs/{run_id}/events", {"events": batch[3:]})
    kept = (body.get("seq"), body.get("last_seq")) == (3, 2) and retry.status == 200
    kept = kept and worker_events(server, run_id) == ["started", "progress", "progress"]
    return answer.status, kept and server.store.get_run(run_id).last_seq == 4


def case_nan_loss(server: Server, run_id: int) -> tuple[int, bool]:
    # The flow writes its own step and log events meanwhile: compare the worker's only.
    before = worker_events(server, run_id)
    raw = b'{"events": [{"seq": 5, "type": "progress", "step": 30, "total": 40, "loss": NaN}]}'
    answer = server.agent("POST", f"{V1}/runs/{run_id}/events", raw=raw)
    listed = server.admin("GET", f"{API}/runs")
    strict_json(listed.body)
    return answer.status, worker_events(server, run_id) == before and listed.status == 200


def case_nan_options(server: Server, run_id: int) -> tuple[int, bool]:
    before = server.store.count_runs()
    answer = server.admin("POST", f"{API}/runs", b'{"trainer": "hf-text-classification", "options": {"epochs": NaN}}')
    return answer.status, server.store.count_runs() == before


def case_deep_json(server: Server, run_id: int) -> tuple[int, bool]:
    answer = server.admin("POST", f"{API}/runs", b"[" * 100_000 + b"]" * 100_000)
    return answer.status, server.alive()


def case_huge_run_id(server: Server, run_id: int) -> tuple[int, bool]:
    answer = server.agent("GET", f"{V1}/runs/99999999999999999999")
    return answer.status, server.alive()


def case_crlf_next(server: Server, run_id: int) -> tuple[int, bool]:
    body = f"api_key={ADMIN_KEY}&next=/admin/training%0D%0ASet-Cookie:%20owned=1".encode()
    answer = server.request("POST", "/admin/training/login", body,
                            {"Content-Type": "application/x-www-form-urlencoded"})
    return answer.status, answer.headers.get("Location") == "/admin/training" and \
        "owned" not in answer.headers.get("Set-Cookie", "")


def case_score_not_a_mapping(server: Server, run_id: int) -> tuple[int, bool]:
    answer = server.agent("POST", f"{V1}/runs/{run_id}/result", {"exit_code": 0, "scores": {"sentiment": 0.9}})
    listed = subprocess.run([POTATO, "training", "runs",
                             str(server.config_path)], capture_output=True, text=True, timeout=60)
    nothing = server.store.get_run(run_id).scores == {} and not (server.run_dir(run_id) / "exit_code").exists()
    return answer.status, nothing and listed.returncode == 0


def case_bad_confidence(server: Server, run_id: int) -> tuple[int, bool]:
    body = PREDICTION + b'{"id": "r2", "schema": "sentiment", "label": "negative", "confidence": "high"}\n'
    answer = server.agent("PUT", f"{V1}/runs/{run_id}/predictions", raw=body)
    return answer.status, untouched_predictions(server, run_id)


def cancel(server: Server, run_id: int) -> None:
    assert server.admin("POST", f"{API}/runs/{run_id}/cancel").status == 200
    wait_for(lambda: server.store.get_run(run_id).state == "cancelled", 60, "the cancel to end the run", server)


def case_result_after_cancel(server: Server, run_id: int) -> tuple[int, bool]:
    cancel(server, run_id)
    answer = server.agent("POST", f"{V1}/runs/{run_id}/result", {
        "exit_code": 0, "scores": {"sentiment": {"accuracy": 1.0, "macro_f1": 1.0, "n": 8}},
        "artifact_uri": "evil:/elsewhere"})
    run = server.store.get_run(run_id)
    return answer.status, (run.state, run.scores, run.artifact_uri) == ("cancelled", {}, None)


def case_events_after_end(server: Server, run_id: int) -> tuple[int, bool]:
    before = server.store.events(run_id)
    answer = server.agent("POST", f"{V1}/runs/{run_id}/events", {"events": [progress(9, 39)]})
    return answer.status, server.store.events(run_id) == before


def case_predictions_after_end(server: Server, run_id: int) -> tuple[int, bool]:
    answer = server.agent("PUT", f"{V1}/runs/{run_id}/predictions", raw=PREDICTION)
    return answer.status, untouched_predictions(server, run_id)


def case_busy_store(server: Server, run_id: int) -> tuple[int, bool]:
    """Another process holds the run store's write lock for longer than the server waits for it."""
    body = json.dumps({"trainer": "hf-text-classification", "schemas": ["sentiment"], "backend": "local"}).encode()
    before = server.store.count_runs()
    holder = sqlite3.connect(server.store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        answer = server.admin("POST", f"{API}/runs", body)
        nothing_yet = server.store.count_runs() == before
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    retried = server.admin("POST", f"{API}/runs", body)  # what Retry-After asks for: one run, not two
    if retried.status == 201:
        server.admin("POST", f"{API}/runs/{retried.json()['run']['id']}/cancel")
    once = retried.status == 201 and server.store.count_runs() == before + 1
    return answer.status, nothing_yet and answer.headers.get("Retry-After") == "1" and once


# (case, expected answer, check); in order: the run is running until "result after the run was cancelled".
CASES: list[tuple[str, int, Callable[[Server, int], tuple[int, bool]]]] = [
    ("600 MiB predictions upload, known agent (headers only)", 413, case_600_mib_upload),
    ("600 MiB predictions upload, no token (headers only)", 401, case_strangers_upload),
    ("the same, waiting for 100 Continue (as curl does)", 401, case_strangers_upload_expecting_continue),
    ("events from a guessed token (headers only)", 401, case_strangers_events),
    ("2 MiB of JSON events, known agent (headers only)", 413, case_oversized_json),
    ("chunked JSON events, known agent (headers only)", 411, case_chunked_json),
    ("events batch with a bad event in the middle", 400, case_bad_event_mid_batch),
    ("NaN loss in an event", 400, case_nan_loss),
    ("NaN in a run's options (admin API)", 400, case_nan_options),
    ("JSON nested 100 000 levels deep", 400, case_deep_json),
    ("run id 99999999999999999999", 404, case_huge_run_id),
    ("CR/LF in the login form's next", 302, case_crlf_next),
    ("result whose score is not a mapping", 400, case_score_not_a_mapping),
    ("predictions with a non-numeric confidence", 400, case_bad_confidence),
    ("result after the run was cancelled", 409, case_result_after_cancel),
    ("events after the run ended", 409, case_events_after_end),
    ("predictions after the run ended", 409, case_predictions_after_end),
    (f"a write while another process holds the store ({BUSY_WAIT_S} s)", 503, case_busy_store),
]


def run_cases(server: Server) -> list[Row]:
    run_id = start_and_claim(server)
    rows = []
    for case, expected, check in CASES:
        answer, nothing_lost = check(server, run_id)
        rows.append(Row(case, expected, answer, nothing_lost))
    return rows


# -- the annotators' cases ------------------------------------------------------------------------------

ITEMS = 2000
TARGETED = 10
UPDATE_FREQUENCY = 5
# A log line that quotes ids is cut short; none may be longer than this.
LINE_BOUND = 1000
LONE_SURROGATE = "\ud83d"
LONG_ID = "x" * 2_000_000


def annotators_project(root: Path) -> tuple[Path, list[str]]:
    """2,000 items; alice and bob label each one (10 % wrong), mallory agrees with the truth except on
    ten items of her choosing where both of them are right. Returns the config and mallory's targets."""
    import random

    from tests.support.potato_project import make_project, true_label

    rng = random.Random(9)
    truth = {f"r{i}": true_label(i) for i in range(ITEMS)}
    flip = {"positive": "negative", "negative": "positive"}
    honest = {user: {i: flip[t] if rng.random() < 0.1 else t for i, t in truth.items()} for user in ("alice", "bob")}
    targets = [i for i, t in truth.items() if honest["alice"][i] == honest["bob"][i] == t][:TARGETED]
    mallory = {i: flip[t] if i in targets else t for i, t in truth.items()}
    config = make_project(root, n_items=ITEMS, annotators=("alice", "bob", "mallory"),
                          user_labels={**honest, "mallory": mallory}, model_training={
                              "enabled": False, "grace_seconds": 1, "aggregation": "consensus",
                              "backends": {"lab-workstation": {"type": "agent", "queue_timeout_s": 600}},
                              "auto_retrain": {"enabled": True, "schemas": ["sentiment"], "min_interval_s": 0,
                                               "update_frequency": UPDATE_FREQUENCY, "backend": "lab-workstation"}})
    return config, targets


def plant(server: Server, user: str, ids: list[str]) -> None:
    """*user*'s user_state.json gains a label on each of *ids*, written as Potato 2.12 writes it."""
    path = server.config.output_annotation_dir / user / "user_state.json"
    state = json.loads(path.read_text())
    for item_id in ids:
        state["instance_id_to_label_to_value"][item_id] = [[{"schema": "sentiment", "name": "positive"}, "positive"]]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))  # 2.12's json.dump: ensure_ascii, so "\ud83d" is its escape
    os.replace(tmp, path)


def claim_job(server: Server, run_id: int) -> dict:
    def claimed():
        answer = server.agent("POST", f"{V1}/backends/lab-workstation/claim", {"agent": {"host": "abuse-report"}})
        return answer.json()["job"]
    job = wait_for(claimed, 120, f"run {run_id}'s flow to offer it to an agent", server)
    assert job["run_id"] == run_id, job
    return job


def finish_as_agent(server: Server, run_id: int) -> str:
    """Report run *run_id* succeeded, as an agent whose worker did; return the state it ends in."""
    events = [event(1, type="started", pid=1, python="3.11.7", device="cpu", device_name="CPU"),
              event(2, type="done", status="succeeded")]
    server.agent("POST", f"{V1}/runs/{run_id}/events", {"events": events})
    server.agent("POST", f"{V1}/runs/{run_id}/result", {"exit_code": 0, "scores": {}})
    return wait_for(lambda: (run := server.store.get_run(run_id)).is_finished and run.state, 120,
                    f"run {run_id} to end", server)


def bundle_labels(server: Server, job: dict) -> dict[str, str]:
    import io
    import tarfile

    answer = server.agent("GET", job["bundle_url"])
    with tarfile.open(fileobj=io.BytesIO(answer.body), mode="r:gz") as tar:
        items = tar.extractfile("items.jsonl").read().decode()
    return {item["id"]: item["labels"].get("sentiment") for item in map(json.loads, items.splitlines())}


def auto_status(server: Server) -> dict:
    return server.admin("GET", f"{API}/auto-retrain").json()


def annotator_cases(server: Server, targets: list[str]) -> list[Row]:
    rows = []
    # The watcher queues the first automatic run at once: 6,000 annotations, none before.
    first = wait_for(lambda: server.store.latest_run(), 60, "the first automatic run", server)
    job = claim_job(server, first.id)
    labels = bundle_labels(server, job)
    right = sum(labels[i] == ("positive", "negative")[int(i[1:]) % 2] for i in targets)
    finish_as_agent(server, first.id)
    rows.append(Row("an annotator who is right everywhere but on 10 items of her choosing (consensus)",
                    f"{TARGETED} of {TARGETED} right", f"{right} of {TARGETED} right",
                    "otherwise than majority vote" in server.run_dir(first.id).joinpath("run.log").read_text()))

    plant(server, "mallory", [LONE_SURROGATE, LONG_ID])
    body = json.dumps({"trainer": "hf-text-classification", "schemas": ["sentiment"],
                       "backend": "lab-workstation"}).encode()
    run_id = server.admin("POST", f"{API}/runs", body).json()["run"]["id"]
    claim_job(server, run_id)
    state = finish_as_agent(server, run_id)
    log = server.run_dir(run_id).joinpath("run.log").read_text(encoding="utf-8")
    named = ("2 labels by mallory on 2 ids that are not items of this project were ignored: "
             "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…' (2000000 "
             "characters), '\\ud83d'")
    rows.append(Row("a label on a lone-surrogate id (2.12's /submit_annotation takes any id)", "succeeded", state,
                    named in log))
    shown = server.admin("GET", f"{API}/runs/{run_id}")
    bounded = all(len(line) < LINE_BOUND for line in log.splitlines()) and len(shown.body) < 100_000 and all(
        len(e.data.get("message", "")) < LINE_BOUND for e in server.store.events(run_id))
    rows.append(Row("a label on a 2 MB id: run log, run page and store lines stay short", "succeeded", state,
                    bounded and named in log))

    before = wait_for(lambda: (s := auto_status(server))["annotations"] is not None and s, 30, "a watcher check")
    plant(server, "mallory", [f"planted{k}" for k in range(5000)])
    shutil.rmtree(server.config.output_annotation_dir / "mallory")  # an admin removes the annotator
    wait_for(lambda: auto_status(server)["annotations"] == before["annotations"] - ITEMS, 30,
             "the watcher to see mallory gone", server)
    carol = server.config.output_annotation_dir / "carol" / "user_state.json"
    carol.parent.mkdir()
    carol.write_text(json.dumps({"user_id": "carol", "instance_id_to_label_to_value": {
        f"r{i}": [[{"schema": "sentiment", "name": "positive"}, "positive"]] for i in range(UPDATE_FREQUENCY)}},
        indent=2))
    queued = wait_for(lambda: (r := server.store.latest_run()).id != run_id and r, 30,
                      f"{UPDATE_FREQUENCY} new annotations to queue an automatic run", server)
    shown = server.admin("GET", f"{API}/runs/{queued.id}").json()["run"]  # queued until an agent claims it
    rows.append(Row("5,000 ids planted, then the annotator removed: the next 5 annotations retrain",
                    "auto run queued", f"{shown['trigger']} run {shown['state']}", True))
    server.admin("POST", f"{API}/runs/{queued.id}/cancel")
    return rows


# -- the data providers' cases ------------------------------------------------------------------------

PER_FILE = 3000
SHARED = 10
VICTIM = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHv the server's own key\n"
UNREADABLE_CSV = b'id,text\nd0,"' + b"x" * 200_000 + b'"\n'  # a cell past the csv module's 128 kB
PASSWORD = "s3cr3t-Pa55word"


def _provider_config(root: Path, files: dict[str, list[str]], *, written_back: bool = False) -> Path:
    """A project whose items are in the watched data_directory items/ (*files*: name -> ids), live writeback
    on, an agent backend; with *written_back*, its writeback file already holds a prediction for each item
    (a run whose live writeback has not happened yet). Alice labelled the first ten items."""
    import yaml

    from tests.support.potato_project import write_user_state

    items = root / "items"
    items.mkdir(parents=True)
    for name, ids in files.items():
        (items / name).write_text("".join(json.dumps({"id": i, "text": f"review {i}: {('good', 'bad')[k % 2]}"})
                                          + "\n" for k, i in enumerate(ids)))
    first = next(iter(files.values()))
    write_user_state(root / "annotations", "alice", {i: {"sentiment": ("positive", "negative")[k % 2]}
                                                    for k, i in enumerate(first[:10])})
    if written_back:
        training = root / "annotations" / "training"
        training.mkdir(parents=True)
        (training / "predictions.jsonl").write_text("".join(json.dumps({"id": i, "predictions": {"sentiment": {
            "label": "positive", "confidence": 0.9, "run_id": 1}}}) + "\n" for ids in files.values() for i in ids))
    raw = {
        "annotation_task_name": "Provider", "task_dir": ".", "data_directory": "items", "admin_api_key": ADMIN_KEY,
        "watch_data_directory": True, "watch_poll_interval": 1, "output_annotation_dir": "annotations",
        "annotation_schemes": [{"annotation_type": "radio", "name": "sentiment", "labels": ["positive", "negative"]}],
        "pre_annotation": {"enabled": True},
        "model_training": {"enabled": True, "grace_seconds": 1, "holdout_fraction": 0.0,
                           "writeback": {"schemas": ["sentiment"], "include_unlabeled": True, "live": True},
                           "backends": {"lab-workstation": {"type": "agent", "queue_timeout_s": 600}}},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _potato_pids(root: Path) -> set[int]:
    """The processes working on the project under *root* (the server and its runs' flows), as /proc shows them."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if str(root).encode() in fh.read():
                        found.add(int(entry))
            except OSError:
                pass
    return found


class Attacker(threading.Thread):
    """Keeps a link to the victim at every temporary name a writer with a guessable name would use (its pid)
    for each data file, as someone who may write the directory and watches /proc would."""

    def __init__(self, items: Path, root: Path, victim: Path):
        super().__init__(daemon=True)
        self.items, self.root, self.victim = items, root, victim
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for pid in _potato_pids(self.root):
                for name in ("a.jsonl", "b.jsonl", "shared.jsonl"):
                    try:
                        (self.items / f".{name}.live-{pid}.tmp").symlink_to(self.victim)
                    except OSError:
                        pass
            self.stop.wait(0.01)


class Feed(threading.Thread):
    """Appends items to a data file by the feeds' rule (per batch: open, flock, check it is still the file,
    append, close), each batch a few milliseconds long, until stopped; ``fed`` is what it appended."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path = path
        self.fed: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        import fcntl

        while not self.stop.is_set():
            item = f"fed{len(self.fed)}"
            line = json.dumps({"id": item, "text": "a review a feed brought"}).encode() + b"\n"
            with open(self.path, "ab") as out:
                fcntl.flock(out, fcntl.LOCK_EX)
                if os.fstat(out.fileno()).st_ino != os.stat(self.path).st_ino:
                    continue  # the writeback replaced it meanwhile: open the name again
                out.write(line[:12])
                out.flush()
                time.sleep(0.002)
                out.write(line[12:])
            self.fed.append(item)
            time.sleep(0.005)


def _ids_in(path: Path) -> list[str]:
    """The ids of a JSON lines file's records (a line that is not one, half an appended item, counts none)."""
    found = []
    for line in path.read_bytes().splitlines():
        try:
            found.append(json.loads(line)["id"])
        except (ValueError, KeyError, TypeError):
            pass
    return found


def _safely(case: str, expected: str, check: Callable[[], tuple[str, bool]]) -> Row:
    """The case's row; a check that raises is a "no" (the answer says what it raised)."""
    try:
        answer, nothing_lost = check()
    except Exception as exc:  # noqa: BLE001 - a broken case is a failed row, not a broken report
        answer, nothing_lost = f"{type(exc).__name__}: {str(exc)[:200]}", False
    return Row(case, expected, answer, nothing_lost)


def _stat_of(path: Path) -> tuple[bytes, int, int, int]:
    st = os.lstat(path)
    return path.read_bytes(), st.st_mode, st.st_uid, st.st_gid


def provider_cases(root: Path) -> list[Row]:
    rows: list[Row] = []
    ids = {"a.jsonl": [f"a{i}" for i in range(PER_FILE)], "b.jsonl": [f"b{i}" for i in range(PER_FILE)]}
    config = _provider_config(root, ids)
    items = root / "items"
    shared = root / "shared" / "dataset.jsonl"  # another project's too
    shared.parent.mkdir()
    shared.write_text("".join(json.dumps({"id": f"s{i}", "text": f"review s{i}"}) + "\n" for i in range(SHARED)))
    (items / "shared.jsonl").symlink_to(shared)
    shared_before = shared.read_bytes()
    victim = root / "victim" / ".ssh" / "authorized_keys"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(VICTIM)
    victim.chmod(0o600)
    victim_before = _stat_of(victim)
    from tests.support.hub import bad_gateway

    gateway, port = bad_gateway()
    hub = {"HF_ENDPOINT": f"http://publisher:{PASSWORD}@127.0.0.1:{port}", "HF_TOKEN": "hf_abuseReportToken0123456789",
           "HF_HOME": str(root / "hf-home")}
    cases = [
        ("a link planted at each guessable temporary name of the live writeback (a data provider)",
         "victim unchanged"),
        ("a data file that is a link to a dataset outside data_directory", "not live"),
        ("a CSV the run cannot read, dropped into data_directory mid-run", "succeeded"),
        ("a feed appending items (by the feeds' rule) while the writeback rewrites", "0 items lost"),
        ("publish to an HF_ENDPOINT holding user:password, its Hub answering 502 with an empty body", "failed"),
    ]
    server = Server(root, config, env=hub)
    attacker, feed = Attacker(items, root, victim), Feed(items / "a.jsonl")
    seen: dict[str, Any] = {}

    def run_it() -> tuple[str, bool]:
        """The agent run, the provider at work meanwhile; what each case reads is kept in *seen*."""
        run_id = start_and_claim(server)
        (items / "d.csv").write_bytes(UNREADABLE_CSV)  # dropped in while the run trains
        attacker.start()
        feed.start()
        every = [i for name_ids in ids.values() for i in name_ids] + [f"s{i}" for i in range(SHARED)]
        # Both labels, as a model that learned something answers: one label for all, the quality gate holds back.
        body = b"".join(json.dumps({"id": i, "schema": "sentiment", "label": ("negative", "positive")[k % 2],
                                    "confidence": 0.9}).encode() + b"\n" for k, i in enumerate(every))
        uploaded = server.agent("PUT", f"{V1}/runs/{run_id}/predictions", raw=body)
        assert uploaded.status == 200, uploaded.body
        seen["state"] = finish_as_agent(server, run_id)
        feed.stop.set()
        attacker.stop.set()
        feed.join(10)
        attacker.join(10)
        seen["log"] = server.run_dir(run_id).joinpath("run.log").read_text(encoding="utf-8")
        seen["written"] = b'"predictions"' in (items / "b.jsonl").read_bytes()
        return "ran", True

    def victim_case() -> tuple[str, bool]:
        return ("victim unchanged" if _stat_of(victim) == victim_before else "victim written",
                seen["written"] and seen["state"] == "succeeded")

    def link_case() -> tuple[str, bool]:
        linked = "a symbolic link to a file outside the directory" in seen["log"]
        return ("not live" if linked else "rewritten",
                shared.read_bytes() == shared_before and sorted(os.listdir(shared.parent)) == ["dataset.jsonl"])

    def csv_case() -> tuple[str, bool]:
        named = "items/d.csv line 1: not valid CSV: field larger than field limit (131072)" in seen["log"]
        return seen["state"], named and seen["written"]

    def feed_case() -> tuple[str, bool]:
        kept = set(_ids_in(items / "a.jsonl"))
        lost = [i for i in feed.fed if i not in kept]
        live = "Live writeback: " in seen["log"]
        return (f"{len(lost)} items lost", bool(feed.fed) and live and
                [i for i in _ids_in(items / "a.jsonl") if i.startswith("a")] == ids["a.jsonl"])

    try:
        ran = _safely("the data providers' run", "ran", run_it)
        checks = [victim_case, link_case, csv_case, feed_case, lambda: hub_case(server)]
        rows += [_safely(case, expected, check) if ran.ok else Row(case, expected, ran.answer, False)
                 for (case, expected), check in zip(cases, checks)]
    finally:
        feed.stop.set()
        attacker.stop.set()
        server.stop()
        gateway.shutdown()
    rows.append(_safely("potato start killed (SIGKILL) between the two files of its first live writeback, then "
                        "started again", "finished", lambda: killed_first_writeback(root.parent / "killed")))
    return rows


def hub_case(server: Server) -> tuple[str, bool]:
    """Publish a run (its model files here) to the Hub of HF_ENDPOINT=http://publisher:password@…, which answers 502."""
    from potato.runs.paths import run_paths

    run = server.store.create_run("hf-text-classification", ["sentiment"], "local")
    server.store.update_run(run.id, state="succeeded", started_at=time.time() - 1, finished_at=time.time())
    model = run_paths(server.config, run.id).dir / "artifacts" / "sentiment"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    (model / "labels.json").write_text(json.dumps({"kind": "full", "labels": ["positive", "negative"]}))
    asked = server.admin("POST", f"{API}/runs/{run.id}/publish", json.dumps({"repo": "lab/x"}).encode())
    assert asked.status == 202, asked.body
    wait_for(lambda: server.admin("GET", f"{API}/runs/{run.id}/publish").json()["publication"]["state"] != "uploading",
             120, "the publish to end", server)
    shown = server.admin("GET", f"{API}/runs/{run.id}/publish")
    page = server.request("POST", "/admin/training/login", f"api_key={ADMIN_KEY}".encode(),
                          {"Content-Type": "application/x-www-form-urlencoded"})
    cookie = page.headers.get("Set-Cookie", "").split(";")[0]
    run_page = server.request("GET", f"/admin/training/runs/{run.id}", headers={"Cookie": cookie})
    state = shown.json()["publication"]["state"]
    seen = [shown.body, run_page.body, server.store.path.read_bytes(), server.log.read_bytes()]
    nowhere = all(PASSWORD.encode() not in text for text in seen) and b"502" in shown.body
    return state, nowhere and run_page.status == 200


def killed_first_writeback(root: Path) -> tuple[str, bool]:
    """potato start, catching the records up at its start, is killed between the two files of the first live
    writeback; the next start must finish it (not refuse: "already holds a field of its own")."""
    # The second file large enough that its rewrite (about a second) is caught under way.
    ids = {"a.jsonl": [f"a{i}" for i in range(20_000)], "b.jsonl": [f"b{i}" for i in range(150_000)]}
    config = _provider_config(root, ids, written_back=True)
    items = root / "items"
    before = {name: (items / name).read_bytes() for name in ids}
    second = os.stat(items / "b.jsonl").st_ino
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(root / "killed.log", "wb") as log:
        killed = subprocess.Popen([POTATO, "start", str(config), "--port", str(port)], stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)

    def second_file_begun() -> bool:
        if killed.poll() is not None:
            raise RuntimeError("potato start ended before its live writeback was caught")
        if os.stat(items / "b.jsonl").st_ino != second:
            raise RuntimeError("the second file was rewritten before the kill could catch it")
        return any(e.name.startswith(".b.jsonl.live-") for e in os.scandir(items))
    wait_for(second_file_begun, 180, "potato start to begin its live writeback's second file", interval=0.005)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(10)
    left = {name: (items / name).read_bytes() for name in ids}
    server = Server(root, config, log_name="second-start.log")
    try:
        said = server.log.read_text()
        after = {name: (items / name).read_bytes() for name in ids}
        finished = (f"Live writeback: {len(ids['b.jsonl'])} record(s) in 1 file(s) of items/ changed (items/b.jsonl "
                    f"{len(ids['b.jsonl'])})") in said and "The live writeback was refused" not in said
        whole = all(left[n] in (before[n], after[n]) for n in ids) and all(b'"predictions"' in after[n] for n in ids)
    finally:
        server.stop()
    return "finished" if finished else "not finished", whole


def table(rows: list[Row]) -> str:
    width = max(len(r.case) for r in rows)
    lines = [f"{'case':<{width}}  {'answer':>16}  {'expected':>16}  nothing stored/lost", "-" * (width + 58)]
    for r in rows:
        lines.append(f"{r.case:<{width}}  {str(r.answer):>16}  {str(r.expected):>16}  {'yes' if r.ok else 'no'}")
    return "\n".join(lines)


def main() -> int:
    from tests.support.potato_project import make_project

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="potato-abuse-") as tmp:
        config = make_project(Path(tmp) / "clients", n_items=40, model_training={
            "enabled": True, "grace_seconds": 1,
            "backends": {"lab-workstation": {"type": "agent", "queue_timeout_s": 600}}})
        server = Server(Path(tmp) / "clients", config)
        try:
            rows = run_cases(server)
        finally:
            server.stop()
        config, targets = annotators_project(Path(tmp) / "annotators")
        server = Server(Path(tmp) / "annotators", config)
        try:
            rows += annotator_cases(server, targets)
        finally:
            server.stop()
        rows += provider_cases(Path(tmp) / "provider")
    if args.json:
        print(json.dumps([{"case": r.case, "answer": r.answer, "expected": r.expected, "nothing_lost": r.nothing_lost,
                           "ok": r.ok} for r in rows], indent=2))
    else:
        print(table(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
