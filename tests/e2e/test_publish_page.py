"""Publishing from the run page in a real browser (headless Chromium), to the stand-in Hub.

``potato start`` runs in this process (waitress, the dispatcher, the session's
Prefect API) with ``HF_ENDPOINT`` at ``tests.support.hub.StandInHub``; the
Hub's storage host sits behind a throttled proxy, so the upload of the tiny
model takes a few seconds and the page's progress can be seen. A local run
trains, its page publishes it (progress in bytes, then the repo's link, also
in the Runs table), and the page of a run whose model stayed on its ssh host
says why it cannot be published and how to fix that.
"""

from __future__ import annotations

import pytest

from tests.e2e.test_training_page import ARTIFACTS, browser  # noqa: F401 - the module's Chromium fixture

pytestmark = [pytest.mark.browser, pytest.mark.prefect, pytest.mark.training]

TOKEN = "hf_potatoTestPageToken0123456789abcdef"
HOST, REMOTE = "gpu.example.org", "/home/me/.cache/potato-training/jobs/2/artifacts"


@pytest.fixture
def hub():
    from tests.support.hub import StandInHub, quiet_werkzeug
    from tests.support.tcp_proxy import TcpProxy

    quiet_werkzeug()
    hub = StandInHub({TOKEN: ("alice", ("lab",))})
    hub.start()
    with TcpProxy(int(hub.storage_url.rsplit(":", 1)[1])) as proxy:
        proxy.throttle(40_000, "up")  # the tiny model's 120 kB go up in about 3 s
        hub.storage_url = f"http://127.0.0.1:{proxy.port}"
        yield hub
    hub.stop()
    hub.check()


@pytest.fixture
def server(tmp_path, prefect_api, hub, monkeypatch):
    from potato.config import load_config
    from potato.runs import artifact_uri
    from tests.support.potato_project import make_project
    from tests.support.runs import served, store_of, wait_for_state
    from tests.support.tiny_model import tiny_model_path
    from tests.unit.test_server_support import BACKENDS

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    path = make_project(tmp_path, n_items=40, labeled_fraction=0.9, model_training={
        "enabled": True, "backend": "local", "backends": BACKENDS,
        "trainers": {"hf-text-classification": {"model": str(tiny_model_path()), "epochs": 2,
                                                "learning_rate": 0.003, "batch_size": 8}},
    })
    config = load_config(path)
    store = store_of(path)
    with served(config) as url:
        from potato.runs.paths import private_dir, run_paths
        from potato.runs.queue import create_run

        create_run(config, store)  # run 1, trained on this machine
        wait_for_state(store, 1, ("succeeded",), timeout=240)
        # Run 2: an ssh run whose model stayed on the host (fetch_artifacts: false), as the backend records it.
        kept = store.create_run("hf-text-classification", ["sentiment"], "gpu-server")
        store.transition(kept.id, "running", from_states=("queued",))
        store.transition(kept.id, "succeeded", from_states=("running",),
                         artifact_uri=artifact_uri.on_host(HOST, REMOTE))
        private_dir(run_paths(config, kept.id).dir)
        yield url, run_paths(config, kept.id).dir


def test_publish_from_the_run_page_with_progress_then_the_link(browser, server, hub):  # noqa: F811
    from playwright.sync_api import expect

    from potato.publish.publish_errors import ModelOnHost

    url, kept_dir = server
    page = browser.new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{url}/admin/training/runs/1")
    page.get_by_label("Admin key").fill("test-admin-key")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Run 1")).to_be_visible()

    panel = page.locator("#publish")
    expect(panel.get_by_role("heading", name="Model")).to_be_visible()
    expect(page.get_by_role("link", name="Download the model and its card (.tar.gz)")).to_be_visible()
    expect(page.locator("#publish-hub")).to_have_text(hub.url)
    page.get_by_label("Hub repo").fill("lab/page-model")
    page.get_by_role("button", name="Publish").click()
    status = page.locator("#publish-status")
    expect(status).to_contain_text("Uploading to lab/page-model: ")   # the upload's bytes, as they go
    expect(page.locator("#publish-progress")).to_be_visible()
    page.screenshot(path=str(_shot("1-uploading")), full_page=True)
    link = page.get_by_role("link", name="lab/page-model")
    expect(link).to_be_visible(timeout=60_000)
    assert link.get_attribute("href") == f"{hub.url}/lab/page-model"
    commit = hub.repos["lab/page-model"].branches["main"]
    expect(status).to_have_text(f"Published to lab/page-model at commit {commit[:7]} by alice (private).")
    expect(page.locator("#publish-progress")).to_be_hidden()
    assert "model.safetensors" in hub.paths("lab/page-model")
    page.screenshot(path=str(_shot("2-published")), full_page=True)

    page.get_by_role("link", name="← All runs").click()
    expect(page.locator("#run-1 .col-published").get_by_role("link", name="lab/page-model")).to_be_visible()

    page.goto(f"{url}/admin/training/runs/2")
    refusal = page.locator("#publish-refusal")
    expect(refusal).to_have_text(str(ModelOnHost(2, "gpu-server", HOST, REMOTE, str(kept_dir / "artifacts"),
                                                 partly=False)))
    expect(refusal).to_contain_text(f"Run 2's model stayed on {HOST} in {REMOTE} (fetch_artifacts is false for "
                                    f"gpu-server), and publishing needs the model files on this server. Fix: copy them "
                                    f"back (`scp -r {HOST}:{REMOTE} {kept_dir}/`) and publish again, or publish "
                                    f"from {HOST} (`hf upload <owner/name> {REMOTE}`)")
    expect(page.get_by_role("button", name="Publish")).to_be_hidden()
    page.screenshot(path=str(_shot("3-model-on-host")), full_page=True)


def _shot(name: str):
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / f"publish-page-{name}.png"
