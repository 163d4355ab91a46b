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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

V1 = "/training/agent/v1"
API = "/admin/training/api"
ADMIN_KEY = "change-me"
MIB = 1024 * 1024
ANSWER_WITHIN_S = 10
# potato's store waits this long for a write lock before it answers 503.
BUSY_WAIT_S = 30


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

    def __init__(self, root: Path, config_path: Path):
        from potato.runs import open_store
        from potato.config import load_config
        from potato.tokens import register_agent

        self.config_path = config_path
        self.config = load_config(self.config_path)
        self.store = open_store(self.config)
        self.token = register_agent(self.config, self.store, "lab-workstation")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = root / "server.log"
        potato = str(Path(sys.executable).with_name("potato"))
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([potato, "start", str(self.config_path), "--port", str(self.port)],
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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
        return self.config.training_dir / "runs" / str(run_id)

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


def wait_for(condition: Callable[[], Any], timeout: float, what: str, server: Server | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
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
    body = "api_key=change-me&next=/admin/training%0D%0ASet-Cookie:%20owned=1".encode()
    answer = server.request("POST", "/admin/training/login", body,
                            {"Content-Type": "application/x-www-form-urlencoded"})
    return answer.status, answer.headers.get("Location") == "/admin/training" and \
        "owned" not in answer.headers.get("Set-Cookie", "")


def case_score_not_a_mapping(server: Server, run_id: int) -> tuple[int, bool]:
    answer = server.agent("POST", f"{V1}/runs/{run_id}/result", {"exit_code": 0, "scores": {"sentiment": 0.9}})
    listed = subprocess.run([str(Path(sys.executable).with_name("potato")), "training", "runs",
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
    if args.json:
        print(json.dumps([{"case": r.case, "answer": r.answer, "expected": r.expected, "nothing_lost": r.nothing_lost,
                           "ok": r.ok} for r in rows], indent=2))
    else:
        print(table(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
