"""The agent protocol routes (/training/agent/v1) and agent tokens, through Flask's test client."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from potato.backends.agent.steps import check as check_agent
from potato.errors import TokenError
from potato.runs.paths import open_store, run_paths
from potato.runs.store import hash_token
from potato.runs.tokens import issue_run_token, register_agent, register_text
from tests.unit.test_server_support import *  # noqa: F401,F403 - fixtures
from tests.unit.test_server_support import V1, bearer, make_config

BAD_TOKEN = "Missing or invalid agent token: send Authorization: Bearer <token>"


@pytest.fixture
def claimed(client, running_run, token):
    """A lab-workstation run an agent has claimed; returns (run, job)."""
    run = running_run("lab-workstation")
    response = client.post(f"{V1}/backends/lab-workstation/claim", headers=bearer(token),
                           json={"agent": {"host": "ws1", "python": "3.11.7"}})
    assert response.status_code == 200, response.json
    return run, response.json["job"]


# -- tokens and `potato training register` ---------------------------------------------------------


def test_register_text_is_spec_7_word_for_word():
    assert register_text("lab-workstation", "TOKEN", "http://annotate.example.org:8000") == (
        "Token for backend 'lab-workstation' (shown once; registering again replaces it):\n"
        "\n"
        "  TOKEN\n"
        "\n"
        "On the training machine:\n"
        "\n"
        "  export POTATO_TRAINING_TOKEN=TOKEN\n"
        "  potato training agent --server http://annotate.example.org:8000 --backend lab-workstation\n"
    )


def test_register_stores_only_a_hash_and_replaces_the_old_token(project, store):
    first = register_agent(project, store, "lab-workstation")
    assert len(first) >= 43
    record = store.get_token("lab-workstation")
    assert record.token_hash == hash_token(first) and first not in record.token_hash
    second = register_agent(project, store, "lab-workstation")
    assert second != first
    assert store.verify_token("lab-workstation", second)
    assert not store.verify_token("lab-workstation", first)


@pytest.mark.parametrize("name, needle", [
    ("gpu-server", "Backend 'gpu-server' is a ssh backend; only agent backends get a token"),
    ("local", "Backend 'local' is a local backend"),
    ("nope", "No backend named 'nope' in model_training.backends; agent backends in this config: lab-workstation"),
])
def test_register_refuses_non_agent_backends(project, store, name, needle):
    with pytest.raises(TokenError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        register_agent(project, store, name)
    assert store.get_token(name) is None


def test_old_token_is_refused_after_registering_again(client, project, store, token):
    register_agent(project, store, "lab-workstation")
    response = client.post(f"{V1}/backends/lab-workstation/claim", headers=bearer(token))
    assert response.status_code == 401 and response.json == {"error": BAD_TOKEN}


def test_check_agent_report(project, store):
    report = check_agent(project, project.model_training.backends["lab-workstation"], store=store)
    assert not report.ok
    assert report.lines == ["lab-workstation: no token issued yet",
                            f"Issue one with: potato training register lab-workstation {project.path}"]
    register_agent(project, store, "lab-workstation")
    report = check_agent(project, project.model_training.backends["lab-workstation"], store=store)
    assert report.ok and report.lines[1] == "last_seen: never"
    store.touch_token("lab-workstation")
    record = store.get_token("lab-workstation")
    report = check_agent(project, project.model_training.backends["lab-workstation"], store=store,
                         now=record.last_seen + 5)
    assert report.lines[1].startswith("last_seen: 20") and report.lines[1].endswith("UTC (5 s ago)")
    assert report.data["token"]["last_seen"] == record.last_seen


# -- claiming ------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer"}, {"Authorization": "Basic abc"},
                                     {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer " + "x" * 600}])
def test_claim_without_a_valid_token_is_401(client, token, headers):
    response = client.post(f"{V1}/backends/lab-workstation/claim", headers=headers)
    assert response.status_code == 401 and response.json == {"error": BAD_TOKEN}


def test_claim_with_nothing_queued(client, token, store):
    response = client.post(f"{V1}/backends/lab-workstation/claim", headers=bearer(token))
    assert response.json == {"job": None, "poll_interval_s": 1.0, "protocol": 1}
    assert store.get_token("lab-workstation").last_seen is not None  # last_seen set on every request


def test_claim_of_another_backend_is_403(client, token, project, store):
    for name in ("gpu-server", "local", "..", "nope"):
        response = client.post(f"{V1}/backends/{name}/claim", headers=bearer(token))
        assert response.status_code == 403
        assert "This token is backend 'lab-workstation''s" in response.json["error"]


def test_claim_hands_out_the_job_once(client, running_run, token, store, project):
    other = running_run("local")  # another backend's run is never handed out
    run = running_run("lab-workstation")
    response = client.post(f"{V1}/backends/lab-workstation/claim", headers=bearer(token),
                           json={"agent": {"host": "ws1"}})
    job = response.json["job"]
    assert job["run_id"] == run.id and job["trainer"] == "hf-text-classification"
    assert job["schemas"] == ["sentiment"] and job["grace_seconds"] == 20
    assert job["heartbeat_timeout_s"] == 120 and job["max_predictions_mb"] == 512
    assert job["bundle_url"] == f"{V1}/runs/{run.id}/bundle.tar.gz"
    bundle = run_paths(project, run.id).dir / "bundle.tar.gz"
    assert job["bundle_bytes"] == bundle.stat().st_size
    assert job["job"]["run_id"] == run.id and job["job"]["bundle"] == "bundle"
    assert job["job"]["grace_seconds"] == 20
    after = store.get_run(run.id)
    assert after.heartbeat_at is not None and "ws1" in after.step
    assert [e.kind for e in store.events(run.id)] == ["claimed"]
    again = client.post(f"{V1}/backends/lab-workstation/claim", headers=bearer(token))
    assert again.json["job"] is None
    assert store.events(other.id) == []


def test_a_queued_run_is_not_handed_out(client, store, token):
    store.create_run("hf-text-classification", ["sentiment"], "lab-workstation")  # dispatcher has not started it
    assert client.post(f"{V1}/backends/lab-workstation/claim", headers=bearer(token)).json["job"] is None


def test_a_run_without_its_bundle_is_not_handed_out_yet(client, running_run, token):
    running_run("lab-workstation", bundle=False)
    assert client.post(f"{V1}/backends/lab-workstation/claim", headers=bearer(token)).json["job"] is None


def test_claim_body_must_be_json(client, token):
    response = client.post(f"{V1}/backends/lab-workstation/claim", headers=bearer(token), data=b"{x",
                           content_type="application/json")
    assert response.status_code == 400


# -- the bundle --------------------------------------------------------------------------


def test_bundle_download_and_range_resume(client, claimed, token, project):
    run, job = claimed
    full = client.get(job["bundle_url"], headers=bearer(token))
    assert full.status_code == 200 and full.headers["Content-Type"] == "application/gzip"
    assert full.headers["Accept-Ranges"] == "bytes"
    data = full.data
    assert len(data) == job["bundle_bytes"]
    import hashlib

    assert hashlib.sha256(data).hexdigest() == job["bundle_sha256"]
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert "manifest.json" in tar.getnames() and "items.jsonl" in tar.getnames()
    cut = len(data) // 3
    rest = client.get(job["bundle_url"], headers={**bearer(token), "Range": f"bytes={cut}-"})
    assert rest.status_code == 206
    assert rest.headers["Content-Range"] == f"bytes {cut}-{len(data) - 1}/{len(data)}"
    assert data[:cut] + rest.data == data
    beyond = client.get(job["bundle_url"], headers={**bearer(token), "Range": f"bytes={len(data) + 10}-"})
    assert beyond.status_code == 416
    for r in (full, rest, beyond):
        r.close()


def test_bundle_needs_the_token_and_a_claim(client, running_run, token):
    run = running_run("lab-workstation")
    url = f"{V1}/runs/{run.id}/bundle.tar.gz"
    assert client.get(url).status_code == 401
    unclaimed = client.get(url, headers=bearer(token))
    assert unclaimed.status_code == 403 and "has not been claimed" in unclaimed.json["error"]
    assert client.get(f"{V1}/runs/9999/bundle.tar.gz", headers=bearer(token)).status_code == 404
    assert client.get(f"{V1}/runs/9999/bundle.tar.gz").status_code == 401  # no hint for strangers


def test_a_run_of_another_backend_is_not_the_agents(client, running_run, token):
    run = running_run("local")
    response = client.get(f"{V1}/runs/{run.id}", headers=bearer(token))
    assert response.status_code == 403
    assert response.json["error"] == f"This token is backend 'lab-workstation''s; run {run.id} runs on backend 'local'"


def test_token_of_another_agent_backend(tmp_path):

    from potato.server import create_app
    from tests.unit.test_server_support import BACKENDS

    config = make_config(tmp_path, backends={**BACKENDS, "lab-2": {"type": "agent"}})
    store = open_store(config)
    token2 = register_agent(config, store, "lab-2")
    register_agent(config, store, "lab-workstation")
    client = create_app(config, start_background=False, store=store).test_client()
    run = store.create_run("hf-text-classification", ["sentiment"], "lab-workstation")
    store.transition(run.id, "running", from_states="queued")
    store.add_event(run.id, "claimed", {})
    response = client.post(f"{V1}/runs/{run.id}/events", headers=bearer(token2), json={"events": []})
    assert response.status_code == 403 and "backend 'lab-2'" in response.json["error"]
    assert client.post(f"{V1}/backends/lab-workstation/claim", headers=bearer(token2)).status_code == 403
    store.close()


# -- events ---------------------------------------------------------------------------------


def test_events_update_the_run_and_answer_cancel(client, claimed, token, store):
    run, _ = claimed
    url = f"{V1}/runs/{run.id}/events"
    events = [
        {"seq": 1, "t": 1.0, "type": "started", "pid": 9, "python": "3.11.7", "device": "cpu", "device_name": "CPU (8 threads)"},
        {"seq": 2, "t": 2.0, "type": "log", "level": "warning", "message": "cuda:1 does not exist; using the CPU"},
        {"seq": 3, "t": 3.0, "type": "progress", "phase": "train", "step": 10, "total": 40, "epoch": 1, "loss": 0.52},
    ]
    response = client.post(url, headers=bearer(token), json={"events": events})
    assert response.status_code == 200
    assert response.json == {"run_id": run.id, "state": "running", "cancel": False, "accepted": 3, "last_seq": 3}
    after = store.get_run(run.id)
    assert after.gpu == "CPU (8 threads)" and after.host_python == "3.11.7"
    assert after.step == "training: step 10 of 40 (epoch 1), loss 0.5200" and after.progress == 0.25
    kinds = [e.kind for e in store.events(run.id)]
    assert kinds[-3:] == ["log", "log", "progress"] and "started" in kinds
    # A retried batch is not stored twice.
    again = client.post(url, headers=bearer(token), json={"events": events})
    assert again.json["accepted"] == 0 and len(store.events(run.id)) == len(kinds)
    # Cancel reaches the agent as the answer to its next report.
    store.request_cancel(run.id)
    response = client.post(url, headers=bearer(token), json={"events": [
        {"seq": 4, "t": 4.0, "type": "progress", "phase": "train", "step": 11, "total": 40, "loss": 0.5}]})
    assert response.json["cancel"] is True and response.json["accepted"] == 1


def test_events_after_the_run_ended_are_refused_and_store_nothing(client, claimed, token, store):
    run, _ = claimed
    store.transition(run.id, "failed", from_states="running", error="No word from the agent on lab-workstation for 120 seconds")
    before = len(store.events(run.id))
    response = client.post(f"{V1}/runs/{run.id}/events", headers=bearer(token),
                           json={"events": [{"seq": 9, "type": "log", "message": "late"}]})
    assert response.status_code == 409
    assert response.json == {"error": f"Run {run.id} has ended (failed); nothing more is taken for it: stop its worker",
                             "state": "failed"}
    assert len(store.events(run.id)) == before


@pytest.mark.parametrize("body, needle", [
    ({}, 'The body must be {"events": [...]}'),
    ({"events": "x"}, 'The body must be {"events": [...]}'),
    ({"events": [1]}, "events[0]: 1 is not a JSON object; each event is one"),
    ({"events": [{"seq": 1, "type": "explode"}]}, "events[0] (seq 1): type is 'explode'; use one of: started, log,"),
    ({"events": [{"seq": 1, "type": "progress", "step": "ten"}]},
     "events[0] (seq 1): step is 'ten'; use a whole number of at least 0"),
    ({"events": [{"seq": 1, "type": "progress", "loss": True}]}, "events[0] (seq 1): loss is True; use a number"),
    ({"events": [{"type": "log", "seq": 0, "message": "x"}]}, "events[0]: seq is 0; use a whole number of at least 1"),
    ({"events": [{"seq": 1, "type": "metrics", "scores": [1]}]}, "events[0] (seq 1): scores must be a JSON object"),
    ({"events": [{"type": "log"}] * 1001}, "A batch holds at most 1000 events"),
])
def test_bad_event_batches_change_nothing(client, claimed, token, store, body, needle):
    run, _ = claimed
    before = store.get_run(run.id), len(store.events(run.id))
    response = client.post(f"{V1}/runs/{run.id}/events", headers=bearer(token), json=body)
    assert response.status_code == 400 and needle in response.json["error"]
    assert response.json["last_seq"] == 0
    assert (store.get_run(run.id).step, len(store.events(run.id))) == (before[0].step, before[1])


def test_malformed_and_oversized_event_bodies(client, claimed, token):
    run, _ = claimed
    url = f"{V1}/runs/{run.id}/events"
    assert client.post(url, headers=bearer(token), data=b"{", content_type="application/json").status_code == 400
    assert client.post(url, headers=bearer(token), data=b"[]", content_type="application/json").status_code == 400
    assert client.post(url, headers=bearer(token), data=b"x=1").status_code == 415
    big = client.post(url, headers=bearer(token), data=b'{"events": ["' + b"a" * (1100 * 1024) + b'"]}',
                      content_type="application/json")
    assert big.status_code == 413


# -- predictions upload -------------------------------------------------------------------------


def test_predictions_upload(client, claimed, token, project, store):
    run, _ = claimed
    body = b"".join(json.dumps({"id": f"r{i}", "schema": "sentiment", "label": "positive",
                                "confidence": 0.9}).encode() + b"\n" for i in range(100))
    response = client.put(f"{V1}/runs/{run.id}/predictions", headers=bearer(token), data=body)
    assert response.status_code == 200 and response.json == {"run_id": run.id, "bytes": len(body), "lines": 100}
    assert (run_paths(project, run.id).dir / "predictions.jsonl").read_bytes() == body
    assert not [p for p in run_paths(project, run.id).dir.iterdir() if p.name.startswith(".predictions")]


def _small_limit(app, mb=1):
    from dataclasses import replace

    config = app.config["POTATO"]
    app.config["POTATO"] = replace(config, model_training=replace(config.model_training, max_predictions_mb=mb))


def test_predictions_over_the_limit_by_content_length_is_413_unread(app, client, claimed, token, project):
    run, _ = claimed
    _small_limit(app)

    class Unreadable(io.BytesIO):
        def read(self, *a):
            raise AssertionError("the server read the body")

        readline = readinto = read

    response = client.put(f"{V1}/runs/{run.id}/predictions", headers=bearer(token),
                          input_stream=Unreadable(), environ_overrides={"CONTENT_LENGTH": str(2 * 1048576)})
    assert response.status_code == 413
    assert response.json["error"].startswith("predictions.jsonl is larger than model_training.max_predictions_mb (1 MB)")
    assert not (run_paths(project, run.id).dir / "predictions.jsonl").exists()


def test_predictions_over_the_limit_without_content_length_is_counted(app, client, claimed, token, project):
    run, _ = claimed
    _small_limit(app)
    stream = io.BytesIO(b"x" * (1048576 + 10))
    response = client.put(f"{V1}/runs/{run.id}/predictions", headers=bearer(token), input_stream=stream,
                          environ_overrides={"wsgi.input_terminated": True, "CONTENT_LENGTH": ""})
    assert response.status_code == 413
    assert response.json["error"].startswith("predictions.jsonl is larger than model_training.max_predictions_mb (1 MB)")
    assert not (run_paths(project, run.id).dir / "predictions.jsonl").exists()
    assert not [p for p in run_paths(project, run.id).dir.iterdir() if p.name.startswith(".predictions")]


class _Unreadable(io.BytesIO):
    def read(self, *a):
        raise AssertionError("the server read the body")

    readline = readinto = read


@pytest.mark.parametrize("method, path", [
    ("PUT", "artifacts"), ("POST", "artifacts"), ("PUT", "artifacts/sentiment/adapter_model.safetensors"),
    ("PUT", "model.tar.gz"),
])
def test_an_agent_uploading_a_1_gb_adapter_finds_no_door_and_nothing_is_kept(client, claimed, token, project,
                                                                              method, path):
    """An agent's model stays on its machine (the run's artifact_uri says where): no route takes model files,
    so a 1 GB adapter is answered without a byte of it read, and nothing is written that could pass for one."""
    run, _ = claimed
    before = sorted(p.name for p in run_paths(project, run.id).dir.iterdir())
    response = client.open(f"{V1}/runs/{run.id}/{path}", method=method, headers=bearer(token),
                           input_stream=_Unreadable(), environ_overrides={"CONTENT_LENGTH": str(1 << 30)})
    assert response.status_code in (404, 405)
    assert sorted(p.name for p in run_paths(project, run.id).dir.iterdir()) == before
    assert not (run_paths(project, run.id).dir / "artifacts").exists()


def test_a_cut_predictions_upload_keeps_nothing_and_the_next_one_is_taken_whole(client, claimed, token, project):
    """The one upload an agent makes: cut short (fewer bytes than announced), it is refused and leaves no
    file, no temporary; sent again, it is taken whole."""
    run, _ = claimed
    body = b"".join(json.dumps({"id": f"r{i}", "schema": "sentiment", "label": "positive",
                                "confidence": 0.9}).encode() + b"\n" for i in range(100))
    cut = client.put(f"{V1}/runs/{run.id}/predictions", headers=bearer(token), input_stream=io.BytesIO(body[:1000]),
                     environ_overrides={"CONTENT_LENGTH": str(len(body))})
    assert cut.status_code == 400
    assert cut.json["error"] == f"The upload ended after 1000 of {len(body)} bytes; send it again"
    directory = run_paths(project, run.id).dir
    assert not [p.name for p in directory.iterdir() if "predictions" in p.name]
    again = client.put(f"{V1}/runs/{run.id}/predictions", headers=bearer(token), data=body)
    assert again.status_code == 200 and (directory / "predictions.jsonl").read_bytes() == body


def test_predictions_need_a_claimed_run(client, running_run, token):
    run = running_run("lab-workstation")
    assert client.put(f"{V1}/runs/{run.id}/predictions", headers=bearer(token), data=b"{}\n").status_code == 403
    assert client.put(f"{V1}/runs/{run.id}/predictions", data=b"{}\n").status_code == 401


# -- result ------------------------------------------------------------------------------------


def test_result(client, claimed, token, project, store):
    run, _ = claimed
    scores = {"sentiment": {"accuracy": 0.9, "macro_f1": 0.89, "n": 6},  # a nominal schema's, as agents sent them
              "rating": {"kind": "ordinal", "accuracy": 0.5, "mae": 1.25, "spearman": -0.2, "n": 6},
              "topics": {"kind": "multilabel", "exact_match": None, "micro_f1": None, "macro_f1": None, "n": 0}}
    body = {"exit_code": 0, "scores": scores, "artifact_uri": "ws1:/home/me/.cache/potato-training/jobs/1/artifacts"}
    response = client.post(f"{V1}/runs/{run.id}/result", headers=bearer(token), json=body)
    assert response.status_code == 200 and response.json["recorded"] is True
    directory = run_paths(project, run.id).dir
    assert json.loads((directory / "scores.json").read_text()) == scores
    assert (directory / "exit_code").read_text() == "0\n"
    after = store.get_run(run.id)
    assert after.scores == scores and after.artifact_uri == body["artifact_uri"]
    assert store.events(run.id)[-1].kind == "result"
    assert client.post(f"{V1}/runs/{run.id}/result", headers=bearer(token), json=body).json["already_recorded"]
    conflict = client.post(f"{V1}/runs/{run.id}/result", headers=bearer(token), json={"exit_code": 1})
    assert conflict.status_code == 409


@pytest.mark.parametrize("body, needle", [
    ({}, "exit_code is missing"),
    ({"exit_code": "0"}, "exit_code is '0'; use a whole number from -255 to 255"),
    ({"exit_code": True}, "exit_code is True; use a whole number from -255 to 255"),
    ({"exit_code": 10**30}, "exit_code is 1000000000000000000000000000000; use a whole number from -255 to 255"),
    ({"exit_code": 0, "scores": [1]}, "scores must be a JSON object"),
    ({"exit_code": 0, "scores": {"s": {"kind": "rating", "n": 3}}},
     "scores.s.kind is 'rating'; use one of: nominal, ordinal, continuous, multilabel, span, text, comparison, "
     "best_worst, ranking"),
    ({"exit_code": 0, "artifact_uri": 5}, "artifact_uri is 5; use a string of at most 2000 characters"),
    ({"exit_code": 0, "artifact_uri": "ws1:/x\n2024-01-01 ERROR forged"}, "without control characters"),
    ({"exit_code": 0, "error": {}}, "error is {}; use a string of at most 65536 characters"),
])
def test_bad_results_change_nothing(client, claimed, token, project, store, body, needle):
    run, _ = claimed
    response = client.post(f"{V1}/runs/{run.id}/result", headers=bearer(token), json=body)
    assert response.status_code == 400 and needle in response.json["error"]
    assert not (run_paths(project, run.id).dir / "exit_code").exists()
    assert store.get_run(run.id).scores == {}


# -- status, heartbeat ---------------------------------------------------------------------------


def test_status_and_heartbeat(client, claimed, token, store):
    run, _ = claimed
    store.update_run(run.id, heartbeat_at=1.0)
    response = client.get(f"{V1}/runs/{run.id}", headers=bearer(token))
    assert response.json == {"run_id": run.id, "state": "running", "cancel": False}


# -- per-run tokens (the agent of an ssh or slurm run) ------------------------------------------


def test_run_token(client, running_run, store, project):
    run = running_run("gpu-server")
    other = running_run("cluster")
    token = issue_run_token(store, run.id)
    other_token = issue_run_token(store, other.id)
    assert store.get_run(run.id).run_token_hash == hash_token(token)
    response = client.post(f"{V1}/backends/gpu-server/claim", headers=bearer(token))
    assert response.json["job"]["run_id"] == run.id
    assert client.post(f"{V1}/backends/cluster/claim", headers=bearer(token)).status_code == 403
    events = client.post(f"{V1}/runs/{run.id}/events", headers=bearer(token),
                         json={"events": [{"seq": 1, "type": "progress", "phase": "train", "step": 1, "total": 2}]})
    assert events.status_code == 200 and events.json["accepted"] == 1
    wrong = client.post(f"{V1}/runs/{run.id}/events", headers=bearer(other_token), json={"events": []})
    assert wrong.status_code == 403
    assert wrong.json["error"] == f"This token is the token of run {other.id}; it cannot act on run {run.id}"
    # After the run ends, its token opens nothing new.
    store.transition(run.id, "succeeded", from_states="running")
    assert client.post(f"{V1}/backends/gpu-server/claim", headers=bearer(token)).status_code == 401


def test_backend_token_cannot_act_on_ssh_runs(client, running_run, token, store):
    run = running_run("gpu-server")
    issue_run_token(store, run.id)
    response = client.post(f"{V1}/runs/{run.id}/events", headers=bearer(token), json={"events": []})
    assert response.status_code == 403
