"""The Training page in a real browser (headless Chromium through Playwright).

Starts the app as ``potato start`` does (waitress, the dispatcher, the
session's Prefect API) on loopback, logs in, checks the Runs on menu, presses
Check, starts a local run of the tiny model and watches it to ``succeeded``,
opens its run page (loss chart, confusion matrix, reliability diagram), cancels a
second run from the page, is refused decision-calibrate on an ssh backend, runs it
locally and sees the reliability diagram's bars after calibration.
Screenshots go to ``test-artifacts/`` (gitignored).

Needs Chromium (``apt-get install -y chromium``) and ``pip install playwright``
(its own browser download is not used: ``executable_path=/usr/bin/chromium``).
Skipped when either is missing, unless ``CI=true``: then it fails.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.prefect, pytest.mark.training]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("POTATO_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
RUN_TIMEOUT_MS = 240_000


def _unavailable(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the browser test must run)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    if not (shutil.which(CHROMIUM) or Path(CHROMIUM).is_file()):
        _unavailable(f"no Chromium at {CHROMIUM}; install it with: apt-get install -y chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is missing; install it with: pip install playwright")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def server(tmp_path, prefect_api):
    """The app served by waitress with the dispatcher running; yields its base URL."""
    from potato.config import load_config
    from tests.support.potato_project import make_project
    from tests.support.runs import served
    from tests.support.tiny_model import tiny_model_path
    from tests.unit.test_server_support import BACKENDS

    # 80 items, 0.3 held out: enough held-out items (about 20) for decision-calibrate to judge a map.
    path = make_project(tmp_path, n_items=80, labeled_fraction=0.9, model_training={
        "enabled": True, "backend": "local", "backends": BACKENDS, "holdout_fraction": 0.3,
        # The gate off: a tiny model in 4 epochs may answer one label for all, and this test follows its
        # predictions through the page (tests/e2e/test_gate_page.py is the gate's).
        "writeback": {"schemas": ["sentiment"], "include_unlabeled": True, "gate": False},
        "trainers": {"hf-text-classification": {"model": str(tiny_model_path()), "epochs": 4,
                                                "learning_rate": 0.003, "batch_size": 8}},
    })
    with served(load_config(path)) as url:
        yield url


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"training-page-{name}.png"), full_page=True)


def test_training_page_end_to_end(browser, server):
    from playwright.sync_api import expect

    from potato.training.device import describe_local_device

    page = browser.new_page()
    page.set_default_timeout(20_000)
    external = []
    page.on("request", lambda r: external.append(r.url) if not r.url.startswith(server) else None)

    page.goto(f"{server}/admin/training")
    expect(page.get_by_role("heading", name="Log in to the Training page")).to_be_visible()
    page.get_by_label("Admin key").fill("test-admin-key")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Training", exact=True)).to_be_visible()

    menu = page.get_by_label("Runs on")
    assert menu.locator("option").all_text_contents() == [
        "gpu-server (ssh to gpu.example.org)", "cluster (slurm on login.cluster.example.org)",
        "lab-workstation (agent)", "local (this machine)"]
    expect(menu).to_have_value("local")

    page.get_by_role("button", name="Check").click()
    report = page.locator("#check-report .report-lines")
    expect(report).to_have_text(f"local: this machine, {describe_local_device('auto')}")
    _shot(page, "1-check")

    page.get_by_role("button", name="Start run").click()
    expect(page.locator("#start-message")).to_contain_text("Run 1 queued on local")
    row = page.locator("#run-1")
    step = page.locator("#step-text-1")
    expect(step).to_be_visible(timeout=60_000)  # the live step row of the active run
    assert step.get_attribute("aria-live") == "polite"
    _shot(page, "2-running")
    expect(row.locator(".col-state")).to_have_text("succeeded", timeout=RUN_TIMEOUT_MS)
    expect(row.locator(".col-ran-on")).to_have_text("local")
    expect(row.locator(".col-trigger")).to_have_text("manual")
    expect(row.locator(".col-scores")).to_contain_text("sentiment: accuracy")
    expect(step).to_be_hidden()
    _shot(page, "3-succeeded")

    page.get_by_role("button", name="Start run").click()
    expect(page.locator("#start-message")).to_contain_text("Run 2 queued on local")
    page.once("dialog", lambda dialog: dialog.accept())  # Cancel asks first
    page.get_by_role("button", name="Cancel run 2").click()
    expect(page.locator("#run-2 .col-state")).to_have_text("cancelled", timeout=RUN_TIMEOUT_MS)
    _shot(page, "4-cancelled")

    page.get_by_role("link", name="Run 1", exact=True).click()
    expect(page.get_by_role("heading", name="Run 1")).to_be_visible()
    expect(page.locator("#run-state")).to_have_text("succeeded")
    expect(page.locator("#loss-chart polyline.loss")).to_have_count(1)
    expect(page.locator("#loss-caption")).to_contain_text("loss went from")
    expect(page.locator("#run-log")).to_contain_text("The worker started")
    expect(page.locator("#predictions")).to_contain_text("predictions.")
    # The holdout evaluation: a 2 x 2 confusion matrix and a reliability diagram, before any calibration.
    matrix = page.get_by_role("img", name="Confusion matrix of sentiment")
    expect(matrix.locator("rect.cell")).to_have_count(4)
    counts = [int(t) for t in matrix.locator("text.count").all_text_contents()]
    diagram = page.get_by_role("img", name="Reliability diagram of sentiment")
    expect(diagram.locator("rect.before")).not_to_have_count(0)
    expect(diagram.locator("rect.after")).to_have_count(0)
    held_out = int(diagram.locator("desc").text_content().split(" over ")[1].split()[0])
    assert sum(counts) == held_out >= 10
    _shot(page, "5-run-page")

    # decision-calibrate: refused off local on the page, then run on local; run 1's page shows the after line.
    page.get_by_role("link", name="← All runs").click()
    page.get_by_label("Trainer").select_option("decision-calibrate")
    page.get_by_label("Runs on").select_option("gpu-server")
    page.get_by_role("button", name="Start run").click()
    expect(page.locator("#start-message")).to_have_text(
        "Trainer 'decision-calibrate' runs only on the local backend, and 'gpu-server' is an ssh backend: it "
        "rewrites an earlier run's predictions, which are kept on this server. Start it on 'local' (it needs no "
        "GPU and takes seconds)")
    expect(page.locator("#start-message")).to_have_class("error")
    _shot(page, "6-calibrate-refused")
    page.get_by_label("Runs on").select_option("local")
    page.get_by_role("button", name="Start run").click()
    expect(page.locator("#start-message")).to_contain_text("Run 3 queued on local")
    expect(page.locator("#run-3 .col-state")).to_have_text("succeeded", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#run-3 .col-scores")).to_contain_text("sentiment: ECE ")
    page.get_by_role("link", name="Run 1", exact=True).click()
    expect(page.locator("#evaluation .calibration")).to_contain_text("Calibration by run 3: ")
    expect(diagram.locator("rect.after")).not_to_have_count(0)
    expect(diagram.locator("desc")).to_contain_text("after calibration (")
    _shot(page, "7-run-page-calibrated")

    # Retract: after a confirmation, annotators stop seeing run 1's predictions; the button goes.
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Retract predictions").click()
    expect(page.locator("#retract-status")).to_have_text(
        "Run 1's predictions were retracted: annotators now see no predictions of sentiment once Potato 2.12 "
        "restarts (it reads pre_annotation.predictions_file at its start)")
    expect(page.get_by_role("button", name="Retract predictions")).to_be_hidden()

    # Runs side by side: tick two, compare; what differs is marked.
    page.get_by_role("link", name="← All runs").click()
    compare = page.get_by_role("button", name="Compare selected runs")
    page.get_by_label("Compare run 1").check()
    expect(compare).to_be_disabled()  # one run is no comparison
    page.get_by_label("Compare run 3").check()
    compare.click()
    expect(page.get_by_role("heading", name="Runs 1 and 3 side by side")).to_be_visible()
    trainer = page.locator("#comparison tr").filter(has=page.get_by_role("rowheader", name="trainer"))
    expect(trainer).to_have_class("differs")
    expect(trainer.locator("td")).to_have_text(["hf-text-classification", "decision-calibrate"])
    expect(page.get_by_role("table", name="Confusion matrix of sentiment, run 1").locator("td:not(:empty)")).to_have_count(4)
    _shot(page, "8-compare")
    assert external == [], f"the page fetched from elsewhere: {external}"
