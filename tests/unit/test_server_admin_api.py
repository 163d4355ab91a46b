"""The admin API and the Training page's HTML, through Flask's test client."""

from __future__ import annotations

import json

import pytest

from potato.runs.paths import run_paths
from tests.unit.test_server_support import *  # noqa: F401,F403 - fixtures
from tests.unit.test_server_support import ADMIN, make_config

API = "/admin/training/api"
UNAUTHORIZED = "Missing or wrong admin key: send the config's admin_api_key in the X-API-Key header"


# -- authentication -------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"X-API-Key": "wrong"}, {"X-API-Key": ""},
                                     {"X-API-Key": "test-admin-key "}, {"Authorization": "Bearer test-admin-key"}])
def test_wrong_or_missing_key_is_401_without_a_hint(client, headers):
    for method, url in (("get", f"{API}/runs"), ("post", f"{API}/runs"), ("get", f"{API}/backends"),
                        ("post", f"{API}/backends/local/check"), ("post", f"{API}/runs/1/cancel")):
        response = getattr(client, method)(url, headers=headers, json={})
        assert response.status_code == 401
        assert response.json == {"error": UNAUTHORIZED}
        assert b"test-admin-key" not in response.data


def test_key_in_the_url_is_not_accepted(client):
    assert client.get(f"{API}/runs?api_key=test-admin-key").status_code == 401
    assert client.get(f"{API}/runs?X-API-Key=test-admin-key").status_code == 401


def test_no_admin_key_in_config_means_no_admin(tmp_path, store):
    from dataclasses import replace

    from potato.server import create_app

    config = replace(make_config(tmp_path / "p"), admin_api_key=None)
    client = create_app(config, start_background=False).test_client()
    assert client.get(f"{API}/runs", headers={"X-API-Key": ""}).status_code == 401
    assert client.get(f"{API}/runs", headers={"X-API-Key": "None"}).status_code == 401


def test_page_redirects_to_login_and_login_sets_a_session(client):
    response = client.get("/admin/training")
    assert response.status_code == 302
    assert response.headers["Location"] == "/admin/training/login?next=/admin/training"
    page = client.get("/admin/training/login")
    assert page.status_code == 200 and b'<label for="api_key">Admin key</label>' in page.data
    bad = client.post("/admin/training/login", data={"api_key": "nope"})
    assert bad.status_code == 401 and b"That is not the admin key" in bad.data
    good = client.post("/admin/training/login", data={"api_key": "test-admin-key", "next": "/admin/training"})
    assert good.status_code == 302 and good.headers["Location"] == "/admin/training"
    cookie = good.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "test-admin-key" not in cookie
    assert client.get("/admin/training").status_code == 200
    assert client.get(f"{API}/runs").status_code == 200  # the page's own JSON calls
    client.post("/admin/training/logout")
    assert client.get(f"{API}/runs").status_code == 401


def test_login_never_redirects_off_site(client):
    for target in ("https://evil.example/", "//evil.example/", "/admin/training/../../x\\y"):
        response = client.post("/admin/training/login", data={"api_key": "test-admin-key", "next": target})
        assert response.headers["Location"] == "/admin/training"


def test_session_post_needs_the_csrf_header(client):
    client.post("/admin/training/login", data={"api_key": "test-admin-key"})
    body = {"trainer": "hf-text-classification", "schemas": ["sentiment"], "backend": "local"}
    refused = client.post(f"{API}/runs", json=body)
    assert refused.status_code == 403
    assert "X-Requested-With: potato" in refused.json["error"]
    accepted = client.post(f"{API}/runs", json=body, headers={"X-Requested-With": "potato"})
    assert accepted.status_code == 201


def test_debug_grants_loopback_admin(tmp_path):
    from dataclasses import replace

    from potato.server import create_app

    config = replace(make_config(tmp_path / "p"), debug=True)
    client = create_app(config, start_background=False).test_client()
    assert client.get(f"{API}/runs").status_code == 200  # the test client is 127.0.0.1
    remote = client.get(f"{API}/runs", environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert remote.status_code == 401


# -- the Training page ------------------------------------------------------------


def test_training_page_lists_every_backend_as_spec_writes_it(admin):
    page = admin.get("/admin/training").get_data(as_text=True)
    assert '<label for="backend">Runs on</label>' in page
    for text in ("gpu-server (ssh to gpu.example.org)", "cluster (slurm on login.cluster.example.org)",
                 "lab-workstation (agent)", "local (this machine)"):
        assert text in page
    assert '<option value="gpu-server" data-type="ssh" selected>' in page  # model_training.backend
    assert ">Check</button>" in page and ">Start run</button>" in page
    assert "<th scope=\"col\">Ran on</th>" in page and "<th scope=\"col\">Trigger</th>" in page
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page  # no external asset


def test_page_assets_are_served_locally(admin):
    page = admin.get("/admin/training").get_data(as_text=True)
    for asset in ("style.css", "common.js", "training.js"):
        assert f"/admin/training/static/{asset}" in page
        response = admin.get(f"/admin/training/static/{asset}")
        assert response.status_code == 200
        response.close()
    run_js = admin.get("/admin/training/static/run.js")
    assert b"polyline" in run_js.data  # the loss chart is drawn by the page itself
    run_js.close()


def test_run_page(admin, store):
    run = store.create_run("hf-text-classification", ["sentiment"], "lab-workstation")
    page = admin.get(f"/admin/training/runs/{run.id}").get_data(as_text=True)
    assert f"<h1>Run {run.id}</h1>" in page
    assert "lab-workstation (agent)" in page
    assert '<dd id="run-trigger">manual</dd>' in page
    auto = store.create_run("hf-text-classification", ["sentiment"], "local", trigger="auto", annotation_count=50)
    assert ('<dd id="run-trigger">auto (50 annotations)</dd>'
            in admin.get(f"/admin/training/runs/{auto.id}").get_data(as_text=True))
    assert 'id="loss-chart"' in page and 'role="log"' in page and 'aria-live="polite"' in page
    assert admin.get("/admin/training/runs/999").status_code == 404
    assert admin.get("/admin/training/runs/../etc/passwd").status_code == 404


# -- backends -------------------------------------------------------------------------


def test_backends(admin):
    data = admin.get(f"{API}/backends").json
    assert data["default"] == "gpu-server"
    assert [b["description"] for b in data["backends"]] == [
        "gpu-server (ssh to gpu.example.org)", "cluster (slurm on login.cluster.example.org)",
        "lab-workstation (agent)", "local (this machine)"]
    assert [b["default"] for b in data["backends"]] == [True, False, False, False]


def test_check_local(admin, project):
    from potato.training.device import describe_local_device

    data = admin.post(f"{API}/backends/local/check").json
    assert data["ok"] is True
    assert data["report"] == [f"local: this machine, {describe_local_device(project.model_training.device)}"]


def test_check_agent_before_and_after_register(admin, project, store):
    from potato.runs.tokens import register_agent

    data = admin.post(f"{API}/backends/lab-workstation/check").json
    assert data["ok"] is False
    assert data["report"][0] == "lab-workstation: no token issued yet"
    assert f"potato training register lab-workstation {project.path}" in data["report"][1]
    register_agent(project, store, "lab-workstation")
    data = admin.post(f"{API}/backends/lab-workstation/check").json
    assert data["ok"] is True
    assert data["report"][0].startswith("lab-workstation: agent backend; token issued ")
    assert data["report"][1] == "last_seen: never"


@pytest.mark.parametrize("name", ["nope", "..", "local%2F..", "%2e%2e"])
def test_check_unknown_backend(admin, name):
    response = admin.post(f"{API}/backends/{name}/check")
    assert response.status_code == 404
    assert "error" in response.json


# -- creating runs ------------------------------------------------------------------


def test_create_run(admin, store):
    response = admin.post(f"{API}/runs", json={"trainer": "hf-text-classification", "schemas": ["sentiment"],
                                               "backend": "cluster", "options": {"epochs": 2}})
    assert response.status_code == 201
    run = response.json["run"]
    assert run["state"] == "queued" and run["queue_position"] == 1
    assert run["ran_on"] == {"name": "cluster", "type": "slurm",
                             "description": "cluster (slurm on login.cluster.example.org)"}
    assert response.headers["Location"] == f"{API}/runs/{run['id']}"
    assert store.get_run(run["id"]).options == {"epochs": 2}


def test_create_run_defaults_to_the_configured_backend(admin):
    response = admin.post(f"{API}/runs", json={"trainer": "hf-text-classification", "schemas": ["sentiment"]})
    assert response.json["run"]["backend"] == "gpu-server"


def test_unknown_backend_is_409_naming_the_known_ones(admin, store):
    response = admin.post(f"{API}/runs", json={"trainer": "hf-text-classification", "schemas": ["sentiment"],
                                               "backend": "gpu-servr"})
    assert response.status_code == 409
    assert response.json["known_backends"] == ["cluster", "gpu-server", "lab-workstation", "local"]
    assert "gpu-servr" in response.json["error"]
    assert store.count_runs() == 0


LOCAL_ONLY = ("Trainer 'decision-calibrate' runs only on the local backend, and {name!r} is {kind} backend: it "
              "rewrites an earlier run's predictions, which are kept on this server. Start it on 'local' (it needs "
              "no GPU and takes seconds)")


@pytest.mark.parametrize("backend, kind", [("gpu-server", "an ssh"), ("cluster", "a slurm"),
                                           ("lab-workstation", "an agent"), (None, "an ssh")])
def test_decision_calibrate_off_local_is_409(admin, store, backend, kind):
    body = {"trainer": "decision-calibrate", "schemas": ["sentiment"]} | ({"backend": backend} if backend else {})
    response = admin.post(f"{API}/runs", json=body)
    assert response.status_code == 409
    assert response.json == {"error": LOCAL_ONLY.format(name=backend or "gpu-server", kind=kind)}
    assert store.count_runs() == 0
    accepted = admin.post(f"{API}/runs", json={**body, "backend": "local"})
    assert accepted.status_code == 201 and accepted.json["run"]["trainer"] == "decision-calibrate"


@pytest.mark.parametrize("body, needle", [
    ({"trainer": "no-such-trainer", "schemas": ["sentiment"]}, "Unknown trainer 'no-such-trainer'"),
    ({"trainer": "hf-text-classification", "schemas": ["topic"]}, "Unknown schema 'topic'"),
    ({"trainer": 3, "schemas": ["sentiment"]}, "trainer must be a string"),
    ({"schemas": "sentiment"}, "schemas must be a list"),
    ({"schemas": [1]}, "schemas must be a list"),
    ({"backend": ["local"]}, "backend must be a string"),
    ({"options": [1, 2]}, "options must be a JSON object"),
    ({"trainer": "hf-text-classification", "bogus": 1}, "Unknown field(s) 'bogus'"),
    ({"backend": "../../etc"}, None),
])
def test_bad_run_requests(admin, store, body, needle):
    response = admin.post(f"{API}/runs", json=body)
    assert response.status_code in (400, 409)
    if needle:
        assert response.status_code == 400
        assert needle in response.json["error"]
    assert store.count_runs() == 0


@pytest.mark.parametrize("data, content_type, status", [
    (b"{not json", "application/json", 400),
    (b"[1, 2]", "application/json", 400),
    (b'"text"', "application/json", 400),
    (b"trainer=x", "application/x-www-form-urlencoded", 415),
    (b"", "application/json", 400),
])
def test_malformed_bodies(admin, store, data, content_type, status):
    response = admin.post(f"{API}/runs", data=data, content_type=content_type)
    assert response.status_code == status
    assert response.is_json and "error" in response.json
    assert store.count_runs() == 0


def test_oversized_body_is_413(admin, store):
    response = admin.post(f"{API}/runs", data=b'{"x": "' + b"a" * (2 * 1024 * 1024) + b'"}',
                          content_type="application/json")
    assert response.status_code == 413
    assert response.json == {"error": "The body is 2097161 bytes; a JSON body here may have at most 1048576 bytes",
                             "max_bytes": 1048576}
    assert store.count_runs() == 0


def test_routing_errors_are_json(admin):
    assert admin.get(f"{API}/nothing").json == {"error": "There is nothing at this URL"}
    response = admin.delete(f"{API}/runs")
    assert response.status_code == 405 and "DELETE" in response.json["error"]
    assert admin.get(f"{API}/runs/abc").status_code == 404


def test_internal_errors_are_json_without_traceback(app, admin, monkeypatch):
    from potato.server import admin_api

    def boom(*a, **k):
        raise RuntimeError("secret detail")

    monkeypatch.setattr(admin_api, "backends_json", boom)
    response = admin.get(f"{API}/backends")
    assert response.status_code == 500
    assert response.json == {"error": "Internal error in the annotation server; the server log has the details"}
    assert b"secret detail" not in response.data and b"Traceback" not in response.data


# -- listing, reading, cancelling -------------------------------------------------------


def test_list_runs_newest_first_with_queue_positions(admin, store):
    ids = [admin.post(f"{API}/runs", json={"backend": "local"}).json["run"]["id"] for _ in range(3)]
    data = admin.get(f"{API}/runs").json
    assert [r["id"] for r in data["runs"]] == ids[::-1]
    assert [r["queue_position"] for r in data["runs"]] == [3, 2, 1]
    assert data["total"] == 3
    assert admin.get(f"{API}/runs?limit=1").json["runs"][0]["id"] == ids[-1]
    assert admin.get(f"{API}/runs?limit=0").status_code == 400
    assert admin.get(f"{API}/runs?limit=x").status_code == 400
    assert admin.get(f"{API}/runs?offset=-1").status_code == 400


def test_get_run_with_events_after_a_cursor(admin, store):
    run = store.create_run("hf-text-classification", ["sentiment"], "local")
    for i in range(5):
        store.add_event(run.id, "progress", {"phase": "train", "step": i + 1, "total": 5, "loss": 1.0 / (i + 1)})
    data = admin.get(f"{API}/runs/{run.id}").json
    assert [e["seq"] for e in data["events"]] == [1, 2, 3, 4, 5]
    assert data["next_after"] == 5
    later = admin.get(f"{API}/runs/{run.id}?after=3").json
    assert [e["seq"] for e in later["events"]] == [4, 5]
    assert later["events"][0]["data"]["loss"] == 0.25
    assert admin.get(f"{API}/runs/{run.id}?after=5").json["events"] == []
    assert admin.get(f"{API}/runs/{run.id}?after=-2").status_code == 400
    assert admin.get(f"{API}/runs/424242").status_code == 404


def test_run_json_fields(admin, store, project):
    run = store.create_run("hf-text-classification", ["sentiment"], "local")
    store.transition(run.id, "running", from_states="queued")
    store.update_run(run.id, step="training: step 3 of 10", progress=0.3, prefect_flow_run_id="abc-123",
                     scores={"sentiment": {"accuracy": 0.9, "macro_f1": 0.88, "n": 6}})
    admin.client.application.config["PREFECT_UI_URL"] = "http://127.0.0.1:4200"
    (run_paths(project, run.id).dir / "artifacts" / "sub").mkdir(parents=True)
    (run_paths(project, run.id).dir / "artifacts" / "sub" / "model.bin").write_bytes(b"x" * 10)
    data = admin.get(f"{API}/runs/{run.id}").json
    r = data["run"]
    assert r["state"] == "running" and r["step"] == "training: step 3 of 10" and r["progress"] == 0.3
    assert r["prefect_url"] == "http://127.0.0.1:4200/runs/flow-run/abc-123"
    assert r["duration_s"] is not None and r["queue_position"] is None
    assert r["trigger"] == "manual"
    assert r["scores_text"] == ["sentiment: accuracy 0.900, macro-F1 0.880 (n=6)"]  # what the page shows
    assert data["artifacts"] == [{"path": "sub/model.bin", "bytes": 10}]
    store.update_run(run.id, scores={"sentiment": {"accuracy": None, "macro_f1": None, "n": 0}})
    assert admin.get(f"{API}/runs/{run.id}").json["run"]["scores_text"] == ["sentiment: no holdout scores"]
    auto = store.create_run("hf-text-classification", ["sentiment"], "local", trigger="auto", annotation_count=30)
    assert admin.get(f"{API}/runs/{auto.id}").json["run"]["trigger"] == "auto"


def test_auto_retrain_status(tmp_path):
    from potato.server import create_app

    config = make_config(tmp_path, auto_retrain={"enabled": True, "schemas": ["sentiment"], "update_frequency": 500})
    app = create_app(config, start_background=False)
    client = app.test_client()
    assert client.get(f"{API}/auto-retrain").status_code == 401
    app.extensions["potato.background"].watcher.check_once()
    status = client.get(f"{API}/auto-retrain", headers=ADMIN).json
    assert status["enabled"] is True and status["update_frequency"] == 500
    assert status["text"] == f"waiting for {500 - status['annotations']} more annotation(s) ({status['annotations']} " \
                             "of 500 since the last automatic run)"


def test_cancel_queued_run(admin, store):
    run = store.create_run("hf-text-classification", ["sentiment"], "local")
    response = admin.post(f"{API}/runs/{run.id}/cancel")
    assert response.status_code == 200 and response.json["run"]["state"] == "cancelled"
    assert store.get_run(run.id).state == "cancelled"
    assert admin.post(f"{API}/runs/999/cancel").status_code == 404


def test_cancel_running_run_requests_it(admin, store):
    run = store.create_run("hf-text-classification", ["sentiment"], "local")
    store.transition(run.id, "running", from_states="queued")
    response = admin.post(f"{API}/runs/{run.id}/cancel")
    assert response.json["run"]["state"] == "running" and response.json["run"]["cancel_requested"] is True
    assert store.get_run(run.id).cancel_requested_at is not None


def test_predictions_summary(admin, store, project):
    run = store.create_run("hf-text-classification", ["sentiment"], "local")
    assert admin.get(f"{API}/runs/{run.id}/predictions").json["available"] is False
    rows = [{"id": f"r{i}", "schema": "sentiment", "label": "positive" if i % 3 else "negative",
             "confidence": 0.5 + i / 100} for i in range(30)]
    text = "\n".join(json.dumps(r) for r in rows) + "\nnot json\n"
    run_paths(project, run.id).dir.mkdir(parents=True, exist_ok=True)
    (run_paths(project, run.id).dir / "predictions.jsonl").write_text(text)
    data = admin.get(f"{API}/runs/{run.id}/predictions").json
    assert data["count"] == 30 and data["unreadable_lines"] == 1
    assert data["schemas"]["sentiment"]["labels"] == {"positive": 20, "negative": 10}
    assert abs(data["schemas"]["sentiment"]["mean_confidence"] - (0.5 + 14.5 / 100)) < 1e-9
    assert len(data["sample"]) == 20
    assert admin.get(f"{API}/runs/77/predictions").status_code == 404


def test_agent_run_shows_queued_until_claimed(admin, store, running_run):
    run = running_run("lab-workstation")
    shown = admin.get(f"{API}/runs/{run.id}").json["run"]
    assert shown["state"] == "queued" and shown["stored_state"] == "running"
    store.add_event(run.id, "claimed", {"address": "10.0.0.5"})
    assert admin.get(f"{API}/runs/{run.id}").json["run"]["state"] == "running"
