"""The Prefect UI as its users know it, in a real browser (headless Chromium through Playwright).

The annotation server runs as ``potato start`` runs it, on the session's
Prefect API (the embedded server: its UI must know where its API is). From
a run's page in Potato the test follows the link "this run in the Prefect
UI" and reads, by their text: the flow run ``run-1`` with its tags, its task
runs named for what they did, the run's log lines, the progress artifact
moving while the run trains. It cancels the run with the UI's own Cancel
button (Potato ends it as Cancel run does), then lets a second run finish
and opens its holdout scores table, the project's report (rendered
Markdown) and its link back to the run's page in Potato. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from potato.config import load_config
from potato.runs.prefect_runs import project_key_of
from tests.e2e.test_training_page import ARTIFACTS, browser  # noqa: F401  (the module's Chromium)
from tests.support.runs import (
    processes_matching, served, store_of, tiny_project, wait_for, wait_for_state, wait_for_training,
)

pytestmark = [pytest.mark.browser, pytest.mark.prefect, pytest.mark.training]

# The Prefect UI is a JavaScript app polling its API; on two busy cores a view
# can take a few seconds to fill.
UI_TIMEOUT_MS = 60_000


@pytest.fixture
def potato_server(tmp_path, prefect_api):
    """``potato start`` on loopback (waitress, the dispatcher, the session's Prefect API); yields (URL, config)."""
    config_path = tiny_project(tmp_path, n_items=30, grace_seconds=5)
    with served(load_config(config_path)) as url:
        yield url, config_path


def _start_run(base: str, epochs: int) -> int:
    request = urllib.request.Request(
        f"{base}/admin/training/api/runs", method="POST",
        data=json.dumps({"backend": "local", "options": {"epochs": epochs}}).encode(),
        headers={"X-API-Key": "test-admin-key", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())["run"]["id"]


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"prefect-ui-{name}.png"), full_page=True)


def _open_in_prefect(page, base: str, run_id: int) -> None:
    """From the run's page in Potato, follow its link into the Prefect UI."""
    from playwright.sync_api import expect

    page.goto(f"{base}/admin/training/runs/{run_id}")
    link = page.get_by_role("link", name="this run in the Prefect UI")
    expect(link).to_be_visible()
    link.click()
    expect(page.get_by_text(f"run-{run_id}", exact=True).first).to_be_visible()


def _tab(page, name: str) -> None:
    page.get_by_text(name, exact=True).first.click()


def test_the_prefect_ui_traces_a_run_cancels_it_and_shows_scores(browser, potato_server):
    from playwright.sync_api import expect

    base, config = potato_server
    store = store_of(config)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(UI_TIMEOUT_MS)
    expect.set_options(timeout=UI_TIMEOUT_MS)

    page.goto(f"{base}/admin/training")
    page.get_by_label("Admin key").fill("test-admin-key")
    page.get_by_role("button", name="Log in").click()

    first = _start_run(base, epochs=100000)
    wait_for_training(store, first)
    _open_in_prefect(page, base, first)
    assert "Can't connect to Server API" not in page.content()
    key = project_key_of(load_config(config))
    for tag in (f"project:{key}", "backend:local", "trainer:hf-text-classification"):
        expect(page.get_by_text(tag, exact=True).first).to_be_visible()
    expect(page.get_by_text("Running", exact=True).first).to_be_visible()
    _shot(page, "1-flow-run")

    _tab(page, "Task Runs")
    for name in ("build the bundle of run 1", "connect to this machine", "sync code to this machine",
                 "spawn the worker on this machine", "relay events from this machine"):
        expect(page.get_by_text(name, exact=True).first).to_be_visible()
    _shot(page, "2-task-runs")

    _tab(page, "Logs")
    expect(page.get_by_text(re.compile(r"^The worker started: Python \S+, device ")).first).to_be_visible()
    _shot(page, "3-logs")

    _tab(page, "Artifacts")
    progress = page.get_by_text(re.compile(r"^training: step \d+ of \d+")).first
    expect(progress).to_be_visible()
    seen = progress.inner_text()
    expect(progress).not_to_have_text(seen)  # it moves while the run trains
    _shot(page, "4-progress")

    page.get_by_role("button", name="Cancel", exact=True).click()
    page.get_by_role("dialog").get_by_role("button", name="Confirm").click()
    run = wait_for_state(store, first, ("cancelled", "failed", "succeeded"), timeout=60)
    assert (run.state, run.error) == ("cancelled", "Cancelled in Prefect")
    expect(page.get_by_text("Cancelled", exact=True).first).to_be_visible()
    _shot(page, "5-cancelled")
    done = [e for e in store.events(first) if e.kind == "done"]
    assert done and done[-1].data["status"] == "cancelled"  # SIGTERM, as Cancel run does

    second = _start_run(base, epochs=3)
    run = wait_for_state(store, second, ("succeeded", "failed", "cancelled"), timeout=240)
    assert run.state == "succeeded", run.error
    _open_in_prefect(page, base, second)
    expect(page.get_by_text("Completed", exact=True).first).to_be_visible()
    _tab(page, "Artifacts")
    page.get_by_text(f"run-{second}-scores", exact=True).first.click()
    for column in ("schema", "accuracy", "macro_f1", "n"):
        expect(page.get_by_role("columnheader", name=column, exact=True)).to_be_visible()
    row = page.get_by_role("row").filter(has_text="sentiment")
    for value in (run.scores["sentiment"][k] for k in ("accuracy", "macro_f1", "n")):
        expect(row.get_by_role("cell", name=f"{value:g}", exact=True).first).to_be_visible()  # as JavaScript prints it
    expect(page.get_by_text(f"Holdout scores of run {second}").first).to_be_visible()
    _shot(page, "6-scores")

    # The project's report, rendered, and the link back to the run's page in Potato.
    _open_in_prefect(page, base, second)
    _tab(page, "Artifacts")
    page.get_by_text(f"potato-{key}-report", exact=True).first.click()
    expect(page.get_by_role("heading", name=f"Run {second} of Review Sentiment")).to_be_visible()
    expect(page.get_by_role("heading", name="Per label: sentiment")).to_be_visible()
    expect(page.get_by_role("heading", name="What annotators see")).to_be_visible()
    _shot(page, "7-report")
    _open_in_prefect(page, base, second)
    _tab(page, "Artifacts")
    page.get_by_text(f"potato-{key}-run-page", exact=True).first.click()
    back = page.get_by_role("link", name=f"Run {second} on the Training page")
    expect(back).to_have_attribute("href", f"{base}/admin/training/runs/{second}")
    _shot(page, "8-run-page-link")
    wait_for(lambda: processes_matching(str(config.parent)) == [], 30, "the runs' processes to exit")
