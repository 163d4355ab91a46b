"""A body the server will refuse is refused before it is read, by a real HTTP server.

The app served by waitress (what ``potato start`` uses) and by Werkzeug's
server (its fallback, and an ssh run's protocol socket) on a loopback port;
the client is a raw socket that sends only the request's headers and never
a byte of the announced body. An answer that arrives anyway proves the
server decided from the headers: one that waited for the body would time out.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading

import pytest

from potato.runs.tokens import register_agent
from potato.server import create_app
from potato.server.commands import make_server
from tests.unit.test_server_support import *  # noqa: F401,F403 - fixtures
from tests.unit.test_server_support import ADMIN

V1 = "/training/agent/v1"
MIB = 1024 * 1024
ANSWER_WITHIN_S = 5


@pytest.fixture(params=["waitress", "werkzeug"])
def served(request, project, store, running_run):
    """(port, token, run) of the app served on loopback, with a claimed agent run."""
    token = register_agent(project, store, "lab-workstation")
    run = running_run("lab-workstation")
    store.add_event(run.id, "claimed", {"host": "ws1"})
    app = create_app(project, start_background=False, store=store)
    wsgi = make_server(app, "127.0.0.1", 0, request.param)
    thread = threading.Thread(target=wsgi.serve_forever, daemon=True)
    thread.start()
    yield wsgi, token, run
    # potato start stops either loop with KeyboardInterrupt in its main thread; here, from another:
    if request.param == "werkzeug":
        wsgi.server.shutdown()
    else:
        wsgi.server._map.clear()  # waitress's loop runs while its map holds a socket
    thread.join(10)
    wsgi.close()


def headers_only(port: int, method: str, path: str, headers: dict[str, str]) -> tuple[int, dict]:
    """Send a request's headers and none of its body; return the answer's status and JSON."""
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WITHIN_S) as sock:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode())
        answer = http.client.HTTPResponse(sock)
        answer.begin()  # times out if the server waits for the body
        return answer.status, json.loads(answer.read())


def request(port: int, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


def test_a_600_mib_upload_gets_its_413_before_any_body_byte(served, project):
    wsgi, token, run = served
    status, body = headers_only(wsgi.port, "PUT", f"{V1}/runs/{run.id}/predictions",
                                {"Authorization": f"Bearer {token}", "Content-Length": str(600 * MIB)})
    assert status == 413
    assert body == {"error": "predictions.jsonl is larger than model_training.max_predictions_mb (512 MB) "
                             "(600.0 MB); raise the limit in the config or predict fewer items",
                    "max_predictions_mb": 512}
    assert not [p for p in (project.training_dir / "runs" / str(run.id)).iterdir() if "predictions" in p.name]


@pytest.mark.parametrize("method, path, size, headers", [
    ("PUT", f"{V1}/runs/1/predictions", 600 * MIB, {}),
    ("POST", f"{V1}/runs/1/events", 1000, {"Authorization": "Bearer not-a-token"}),
    ("POST", f"{V1}/backends/lab-workstation/claim", 1000, {}),
    ("POST", "/admin/training/api/runs", 1000, {"X-API-Key": "wrong"}),
])
def test_a_strangers_body_is_refused_without_being_read(served, method, path, size, headers):
    wsgi, _, _ = served
    status, body = headers_only(wsgi.port, method, path, {"Content-Length": str(size), **headers})
    assert status == 401 and body["error"].startswith("Missing or")


def test_a_client_that_waits_for_100_continue_gets_the_refusal_instead(served):
    """curl and other clients send ``Expect: 100-continue`` before a large body."""
    wsgi, _, run = served
    status, body = headers_only(wsgi.port, "PUT", f"{V1}/runs/{run.id}/predictions",
                                {"Content-Length": str(600 * MIB), "Expect": "100-continue"})
    assert status == 401 and body["error"].startswith("Missing or invalid agent token")


def test_a_known_agents_oversized_or_unsized_json_is_refused_unread(served):
    wsgi, token, run = served
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    status, body = headers_only(wsgi.port, "POST", f"{V1}/runs/{run.id}/events", {**auth, "Content-Length": str(2 * MIB)})
    assert (status, body["max_bytes"]) == (413, MIB)
    status, body = headers_only(wsgi.port, "POST", f"{V1}/runs/{run.id}/events", {**auth, "Transfer-Encoding": "chunked"})
    assert status == 411 and body["error"].startswith("Send a JSON body with a Content-Length header")


def test_legitimate_bodies_still_go_through(served, project, store):
    wsgi, token, run = served
    auth = {"Authorization": f"Bearer {token}"}
    events = {"events": [{"seq": 1, "t": 1.0, "type": "progress", "phase": "train", "step": 1, "total": 2}]}
    status, body = request(wsgi.port, "POST", f"{V1}/runs/{run.id}/events", json.dumps(events).encode(),
                           {**auth, "Content-Type": "application/json"})
    assert (status, body["accepted"]) == (200, 1)
    lines = b"".join(json.dumps({"id": f"r{i}", "schema": "sentiment", "label": "positive", "confidence": 0.75})
                     .encode() + b"\n" for i in range(2000))
    status, body = request(wsgi.port, "PUT", f"{V1}/runs/{run.id}/predictions", lines, auth)
    assert (status, body["lines"]) == (200, 2000)
    assert (project.training_dir / "runs" / str(run.id) / "predictions.jsonl").read_bytes() == lines
    status, _ = request(wsgi.port, "GET", "/admin/training/api/runs", b"", ADMIN)
    assert status == 200


def test_waitress_limits_come_from_the_largest_legitimate_body(project, store):
    from potato.server.commands import CONNECTION_LIMIT, waitress_settings

    settings = waitress_settings(create_app(project, start_background=False, store=store))
    assert settings["max_request_body_size"] == 512 * MIB + 1  # max_predictions_mb, not waitress's 1 GiB
    assert settings["connection_limit"] == CONNECTION_LIMIT == 256
