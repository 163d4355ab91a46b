"""A hostile or broken client must not cost an event, a run's result or the server.

Through Flask's test client against the real app and a real store; each test
reproduces one attack or fault of the issue and asserts what the user sees
(the answer, what the store and the run directory hold). The same attacks
against a live ``potato start`` are bench/abuse_report.py's.
"""

from __future__ import annotations

import json
import math
import sqlite3

import pytest

from potato.errors import StoreError, UnknownRun
from potato.runs.paths import open_store, run_paths
from potato.runs.store import Store
from potato.runs.tokens import issue_run_token
from potato.server import create_app
from tests.unit.test_server_support import *  # noqa: F401,F403 - fixtures
from tests.unit.test_server_support import ADMIN, V1, bearer

API = "/admin/training/api"


def strict_json(data: bytes):
    """What a browser's JSON.parse accepts: no NaN, no Infinity."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(data, parse_constant=refuse)


@pytest.fixture
def claimed(client, running_run, token):
    run = running_run("lab-workstation")
    response = client.post(f"{V1}/backends/lab-workstation/claim", headers=bearer(token), json={})
    assert response.json["job"]["run_id"] == run.id
    return run


def started(seq, **extra):
    return {"seq": seq, "t": 1.0, "type": "started", "pid": 9, "python": "3.11.7", "device": "cpu",
            "device_name": "CPU (2 threads)", **extra}


def progress(seq, step, **extra):
    return {"seq": seq, "t": 2.0, "type": "progress", "phase": "train", "step": step, "total": 40, "epoch": 1,
            "loss": 0.5, **extra}


def kinds(store, run_id):
    return [e.kind for e in store.events(run_id) if e.kind != "claimed"]


# -- item 6: one bad event loses only itself -------------------------------------------------------


def test_a_bad_event_keeps_the_events_before_it_and_is_named_with_its_seq(client, claimed, token, store):
    url = f"{V1}/runs/{claimed.id}/events"
    batch = [started(1), progress(2, 10), started(3, device_name={}), progress(4, 20)]
    response = client.post(url, headers=bearer(token), json={"events": batch})
    assert response.status_code == 400
    assert response.json == {
        "error": "events[2] (seq 3): device_name is {}; use a string of at most 300 characters without control "
                 "characters. The events before it are stored (last_seq 2); send the ones after it again",
        "seq": 3, "last_seq": 2}
    run = store.get_run(claimed.id)
    assert run.last_seq == 2 and run.gpu == "CPU (2 threads)" and run.step.startswith("training: step 10 of 40")
    assert kinds(store, claimed.id) == ["started", "log", "progress"]  # the log: "The worker started: …"
    # The agent drops what is stored and the bad one, and sends the rest: nothing lost, nothing twice.
    again = client.post(url, headers=bearer(token), json={"events": batch[3:]})
    assert again.status_code == 200 and again.json["accepted"] == 1 and again.json["last_seq"] == 4
    retried = client.post(url, headers=bearer(token), json={"events": batch[:2] + batch[3:]})
    assert retried.json["accepted"] == 0
    assert kinds(store, claimed.id) == ["started", "log", "progress", "progress"]
    assert store.get_run(claimed.id).step.startswith("training: step 20 of 40")


@pytest.mark.parametrize("event, problem", [
    (started(1, pid="9"), "pid is '9'; use a whole number of at least 0"),
    (started(1, python=["3.11"]), "python is ['3.11']; use a string"),
    (started(1, device_name="A100\n2024-01-01 ERROR forged line"), "device_name is 'A100\\n2024"),
    (started(1, schemas="sentiment"), "schemas is 'sentiment'; use a list of schema names"),
    ({"seq": 1, "type": "log", "level": "fatal", "message": "x"}, "level is 'fatal'; use one of: info, warning, error"),
    ({"seq": 1, "type": "log", "message": 5}, "message is 5; use a string of at most 65536 characters"),
    ({"seq": 1, "type": "log"}, "message is missing"),
    (progress(1, -1), "step is -1; use a whole number of at least 0"),
    (progress(1, 10, phase="sleep"), "phase is 'sleep'; use one of: train, predict"),
    (progress(1, 10, epoch="one"), "epoch is 'one'; use a number of at least 0"),
    ({"seq": 1, "type": "metrics", "scores": {"sentiment": 0.9}},
     'scores.sentiment is 0.9; use a JSON object {schema: {"kind": "nominal", "accuracy": 0.9, "macro_f1": 0.89, "n": 48}}'),
    ({"seq": 1, "type": "metrics", "scores": {"sentiment": {"accuracy": 7}}},
     "scores.sentiment.accuracy is 7; use a number from 0 to 1"),
    ({"seq": 1, "type": "done", "status": "exploded"}, "status is 'exploded'; use one of: succeeded, failed, cancelled"),
    ({"seq": 2**63, "type": "log", "message": "x"}, "seq is 9223372036854775808; use a whole number of at least 1"),
    ({"seq": 1, "t": "noon", "type": "log", "message": "x"}, "t is 'noon'; use a number"),
])
def test_each_field_of_each_event_type_is_checked(client, claimed, token, store, event, problem):
    response = client.post(f"{V1}/runs/{claimed.id}/events", headers=bearer(token), json={"events": [event]})
    assert response.status_code == 400, response.json
    assert problem in response.json["error"]
    assert kinds(store, claimed.id) == [] and store.get_run(claimed.id).last_seq == 0


def test_an_agents_own_note_without_a_seq_is_taken(client, claimed, token, store):
    """Potato's agent sends its SLURM notes ("Submitted SLURM job 42 …") as log events without a seq."""
    note = {"type": "log", "level": "info", "message": "Submitted SLURM job 42 with --gres=gpu:1"}
    answer = client.post(f"{V1}/runs/{claimed.id}/events", headers=bearer(token), json={"events": [note, started(1)]})
    assert answer.status_code == 200 and answer.json["accepted"] == 2 and answer.json["last_seq"] == 1
    assert store.events(claimed.id)[1].data == {"level": "info", "message": note["message"], "source": "worker"}


def test_last_seq_survives_a_restart_so_a_resent_batch_is_not_stored_twice(project, running_run, token, client, store):
    run = running_run("lab-workstation")
    client.post(f"{V1}/backends/lab-workstation/claim", headers=bearer(token), json={})
    batch = {"events": [started(1), progress(2, 10)]}
    assert client.post(f"{V1}/runs/{run.id}/events", headers=bearer(token), json=batch).json["accepted"] == 2
    before = kinds(store, run.id)
    # The server restarts (a new app, a new store handle on the same file); the agent never got its answer.
    restarted_store = open_store(project)
    try:
        restarted = create_app(project, start_background=False, store=restarted_store).test_client()
        answer = restarted.post(f"{V1}/runs/{run.id}/events", headers=bearer(token), json=batch)
        assert answer.status_code == 200 and answer.json["accepted"] == 0 and answer.json["last_seq"] == 2
        assert kinds(restarted_store, run.id) == before
    finally:
        restarted_store.close()


# -- item 7: NaN and Infinity --------------------------------------------------------------------


@pytest.mark.parametrize("raw, where", [
    (b'{"events": [{"seq": 1, "type": "progress", "step": 1, "total": 2, "loss": NaN}]}', "events[0].loss is nan"),
    (b'{"events": [{"seq": 1, "type": "progress", "step": 1, "total": 2, "loss": -Infinity}]}', "events[0].loss is -inf"),
    (b'{"events": [{"seq": 1, "type": "metrics", "scores": {"s": {"accuracy": 1e999}}}]}',
     "events[0].scores.s.accuracy is inf"),
])
def test_nan_and_infinity_in_events_are_refused_naming_where(client, claimed, token, store, raw, where):
    response = client.post(f"{V1}/runs/{claimed.id}/events", headers=bearer(token), data=raw,
                           content_type="application/json")
    assert response.status_code == 400
    assert response.json["error"] == f"{where} in the body; JSON has no NaN or Infinity: send a number or null"
    assert kinds(store, claimed.id) == []


def test_a_null_loss_is_stored_as_null(client, claimed, token, store):
    """What the worker writes for a diverged loss (potato/training/events.py) is taken."""
    response = client.post(f"{V1}/runs/{claimed.id}/events", headers=bearer(token),
                           json={"events": [progress(1, 10, loss=None)]})
    assert response.status_code == 200 and response.json["accepted"] == 1
    assert store.get_run(claimed.id).step == "training: step 10 of 40 (epoch 1)"
    assert store.events(claimed.id)[-1].data["loss"] is None


def test_nan_in_a_result_or_in_run_options_is_refused(client, claimed, token, store, project):
    response = client.post(f"{V1}/runs/{claimed.id}/result", headers=bearer(token), content_type="application/json",
                           data=b'{"exit_code": 0, "scores": {"sentiment": {"accuracy": NaN, "n": 3}}}')
    assert response.status_code == 400 and "scores.sentiment.accuracy is nan" in response.json["error"]
    assert not (run_paths(project, claimed.id).dir / "exit_code").exists() and store.get_run(claimed.id).scores == {}
    runs_before = store.count_runs()
    response = client.post(f"{API}/runs", headers=ADMIN, content_type="application/json",
                           data=b'{"trainer": "hf-text-classification", "options": {"learning_rate": Infinity}}')
    assert response.status_code == 400 and response.json["error"].startswith("options.learning_rate is inf")
    assert store.count_runs() == runs_before


def test_the_store_refuses_nan_and_reads_old_nan_rows_as_null(store, client):
    run = store.create_run("hf-text-classification", ["sentiment"], "local")
    with pytest.raises(StoreError, match="The run's scores holds NaN or Infinity"):
        store.update_run(run.id, scores={"sentiment": {"accuracy": math.nan}})
    with pytest.raises(StoreError, match="The run's options holds NaN or Infinity"):
        store.create_run("hf-text-classification", ["sentiment"], "local", {"epochs": math.inf})
    # A row an older server wrote: the page's JSON stays valid, the value reads as null.
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE runs SET scores = ?, options = ? WHERE id = ?",
                   ('{"sentiment": {"accuracy": NaN, "n": 3}}', '{"learning_rate": Infinity}', run.id))
    answer = client.get(f"{API}/runs", headers=ADMIN)
    listed = strict_json(answer.data)["runs"][0]
    assert listed["scores"] == {"sentiment": {"accuracy": None, "n": 3}} and listed["options"] == {"learning_rate": None}


# -- item 8: a run that ended takes nothing more ----------------------------------------------------


def test_a_cancelled_runs_result_cannot_be_overwritten_by_its_agent(client, claimed, token, store, project):
    store.update_run(claimed.id, artifact_uri="ws1:/kept")
    store.transition(claimed.id, "cancelled", from_states="running", error="Cancelled by request")
    body = {"exit_code": 0, "scores": {"sentiment": {"accuracy": 1.0, "macro_f1": 1.0, "n": 6}},
            "artifact_uri": "evil:/elsewhere"}
    answer = client.post(f"{V1}/runs/{claimed.id}/result", headers=bearer(token), json=body)
    assert answer.status_code == 409 and answer.json["state"] == "cancelled"
    upload = client.put(f"{V1}/runs/{claimed.id}/predictions", headers=bearer(token),
                        data=b'{"id": "r1", "schema": "sentiment", "label": "positive", "confidence": 0.9}\n')
    assert upload.status_code == 409
    run = store.get_run(claimed.id)
    assert (run.state, run.scores, run.artifact_uri) == ("cancelled", {}, "ws1:/kept")
    assert not [p.name for p in run_paths(project, claimed.id).dir.iterdir() if p.name != "bundle" and p.name != "bundle.tar.gz"]


def test_a_run_token_is_refused_once_its_run_ended(client, running_run, store, project):
    run = running_run("gpu-server")
    token = issue_run_token(store, run.id)
    assert client.get(f"{V1}/runs/{run.id}", headers=bearer(token)).status_code == 200
    store.transition(run.id, "failed", from_states="running", error="No word from the agent on gpu-server for 120 seconds")
    for method, suffix, kwargs in [("get", "", {}), ("post", "/events", {"json": {"events": []}}),
                                   ("put", "/predictions", {"data": b"\n"}),
                                   ("post", "/result", {"json": {"exit_code": 0, "artifact_uri": "x:/y"}})]:
        answer = getattr(client, method)(f"{V1}/runs/{run.id}{suffix}", headers=bearer(token), **kwargs)
        assert answer.status_code == 409, (suffix, answer.json)
        assert answer.json["error"] == (f"Run {run.id} has ended (failed); nothing more is taken for it: "
                                        "stop its worker")
    assert store.get_run(run.id).artifact_uri is None
    assert not (run_paths(project, run.id).dir / "exit_code").exists()


def test_a_run_not_started_yet_has_not_ended(client, store, token):
    run = store.create_run("hf-text-classification", ["sentiment"], "lab-workstation")
    answer = client.get(f"{V1}/runs/{run.id}", headers=bearer(token))
    assert answer.status_code == 403 and "has not been claimed by an agent" in answer.json["error"]


# -- item 9: malformed input fails cleanly -----------------------------------------------------------


def test_a_score_that_is_not_a_mapping_is_refused_and_an_old_one_still_lists(client, claimed, token, store, tmp_path):
    answer = client.post(f"{V1}/runs/{claimed.id}/result", headers=bearer(token),
                         json={"exit_code": 0, "scores": {"sentiment": 0.9}})
    assert answer.status_code == 400 and answer.json["error"].startswith("scores.sentiment is 0.9; use a JSON object")
    assert store.get_run(claimed.id).scores == {}
    from potato.follow import format_scores

    assert format_scores({"sentiment": 0.9, "topic": {"accuracy": None, "macro_f1": 0.5}}) == \
        "sentiment ?; topic acc - F1 0.500"
    assert format_scores([1, 2]) == "-"


def test_predictions_with_a_bad_line_are_refused_whole_and_leave_no_file(client, claimed, token, project):
    good = b'{"id": "r1", "schema": "sentiment", "label": "positive", "confidence": 0.9}\n'
    for body, problem in [
        (good + b'{"id": "r2", "schema": "sentiment", "label": "negative", "confidence": "high"}\n',
         "predictions.jsonl line 2: confidence is 'high'; use a number from 0 to 1"),
        (good + b'{"id": "r2", "schema": "sentiment", "label": "negative", "confidence": NaN}\n',
         "confidence is nan in predictions.jsonl line 2; JSON has no NaN or Infinity"),
        (good + b"not json\n", "predictions.jsonl line 2 is not valid JSON"),
        (good + b'{"id": true, "schema": "sentiment", "label": "x", "confidence": 1}', "predictions.jsonl line 2: id is True"),
        # Item ids are strings in the bundle: the writeback would drop a number, so the upload refuses it.
        (good + b'{"id": 7, "schema": "sentiment", "label": "x", "confidence": 1}',
         "predictions.jsonl line 2: id is 7; use the item's id (a non-empty string)"),
        (b"[1]\n", "predictions.jsonl line 1 is [1]; each line is a JSON object"),
    ]:
        answer = client.put(f"{V1}/runs/{claimed.id}/predictions", headers=bearer(token), data=body)
        assert answer.status_code == 400, answer.json
        assert problem in answer.json["error"] and "the upload was not kept" in answer.json["error"]
        leftovers = [p.name for p in run_paths(project, claimed.id).dir.iterdir() if "predictions" in p.name]
        assert leftovers == []


@pytest.mark.parametrize("url", [f"{V1}/runs/99999999999999999999", f"{V1}/runs/99999999999999999999/bundle.tar.gz",
                                 f"{API}/runs/99999999999999999999", "/admin/training/runs/99999999999999999999",
                                 f"{V1}/runs/0", f"{API}/runs/-1"])
def test_huge_or_impossible_run_ids_are_404(client, token, url):
    answer = client.get(url, headers={**ADMIN, **bearer(token)})
    assert answer.status_code == 404 and answer.json == {"error": "There is nothing at this URL"}


def test_huge_query_numbers_are_400(client, store):
    run = store.create_run("hf-text-classification", ["sentiment"], "local")
    for url in (f"{API}/runs/{run.id}?after=99999999999999999999", f"{API}/runs?offset=99999999999999999999"):
        answer = client.get(url, headers=ADMIN)
        assert answer.status_code == 400
        assert "use a whole number from 0 to 9223372036854775807" in answer.json["error"]
    with pytest.raises(UnknownRun):
        store.get_run(10**30)
    assert store.events(10**30) == [] and store.list_runs(offset=10**30) == []


def test_a_crlf_in_the_login_next_is_not_followed(client):
    answer = client.post("/admin/training/login", data={"api_key": "test-admin-key",
                                                        "next": "/admin/training\r\nSet-Cookie: owned=1"})
    assert answer.status_code == 302 and answer.headers["Location"] == "/admin/training"
    assert "owned" not in answer.headers.get("Set-Cookie", "")


@pytest.mark.parametrize("depth", [25, 200_000])
def test_deeply_nested_json_is_400(client, depth):
    body = b"[" * depth + b"]" * depth
    answer = client.post(f"{API}/runs", headers=ADMIN, data=body, content_type="application/json")
    assert answer.status_code == 400
    assert answer.json["error"] == "The body is nested more than 20 levels deep; no request here needs that"


def test_a_busy_store_is_503_with_retry_after_and_the_retry_stores_once(project, token):
    store = Store(project.training_dir / "runs.db", busy_timeout_s=0.2)
    run = store.create_run("hf-text-classification", ["sentiment"], "lab-workstation")
    store.transition(run.id, "running", from_states="queued")
    store.add_event(run.id, "claimed", {})
    client = create_app(project, start_background=False, store=store).test_client()
    batch = {"events": [started(1), progress(2, 10)]}
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        busy = client.post(f"{V1}/runs/{run.id}/events", headers=bearer(token), json=batch)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
    assert busy.json == {"error": "The run store is busy; try again in 1 s"}
    retry = client.post(f"{V1}/runs/{run.id}/events", headers=bearer(token), json=batch)
    assert retry.status_code == 200 and retry.json["last_seq"] == 2
    assert [e.kind for e in store.events(run.id)].count("progress") == 1
    unknown = client.post(f"{V1}/runs/{run.id + 1}/events", headers=bearer(token), json=batch)
    assert unknown.status_code == 404  # an unknown run stays 404
    store.close()
