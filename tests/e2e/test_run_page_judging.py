"""Judging runs from their pages in a real browser (headless Chromium), with no training: the runs are written.

``potato start``'s app runs in this process on waitress, without its
dispatcher (so a queued run stays queued); the store holds runs as their
flows leave them: a run that succeeded (its progress over two epochs, a
validation loss after each, its holdout evaluation with a calibration, a
model on this server and no Hugging Face token here), one cancelled from the
Training page, one training with its ETA and one queued. The page in a
browser in Berlin's time zone must show each as a user needs it: the loss
from zero with its epochs and validation loss, accuracy beside always
answering the most common label, precision, recall and F1 per label, the
reliability diagram's bars before and after with the items per bin and ECE,
the model's download with a quiet note where publishing needs a token, a
cancelled run's who and when instead of promised artifacts, times with their
offset from UTC, Cancel asking first, and a run a trainer would refuse
refused at the start button.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_training_page import ARTIFACTS, browser  # noqa: F401 - the module's Chromium fixture

pytestmark = [pytest.mark.browser]

# 2025-01-15 12:00:00 UTC: 13:00:00 in Berlin (UTC+01:00 in winter).
NOON_UTC = 1736942400.0
CONFUSION = [[20, 5], [3, 17]]  # rows: gold positive, negative; columns: predicted
BEFORE = [{"lo": 0.5, "hi": 0.6, "n": 4, "confidence": 0.55, "accuracy": 0.5},
          {"lo": 0.8, "hi": 0.9, "n": 11, "confidence": 0.85, "accuracy": 0.727},
          {"lo": 0.9, "hi": 1.0, "n": 30, "confidence": 0.97, "accuracy": 0.867}]
AFTER = [{"lo": 0.6, "hi": 0.7, "n": 9, "confidence": 0.66, "accuracy": 0.667},
         {"lo": 0.8, "hi": 0.9, "n": 36, "confidence": 0.84, "accuracy": 0.861}]

PREFERENCE_BINS = [{"lo": 0.5, "hi": 0.6, "n": 6, "confidence": 0.56, "accuracy": 0.5},
                   {"lo": 0.9, "hi": 1.0, "n": 14, "confidence": 0.95, "accuracy": 1.0}]


def _evaluation(run_id: int) -> dict:
    return {"format": 1, "run_id": run_id, "schemas": {"sentiment": {
        "labels": ["positive", "negative"], "n": 45, "missing": 0, "accuracy": 0.8222, "confusion": CONFUSION,
        "reliability": BEFORE, "ece": 0.12,
        "calibration": {"by_run": 9, "kept": True, "reason": "holdout log-loss and ECE fell", "threshold": None,
                        "target_precision": 0.9, "ece_after": 0.03, "reliability_after": AFTER}},
        "pref": {"kind": "comparison", "labels": ["A", "B"], "n": 22, "missing": 0, "agreement": 0.85,
                 "decided": 20, "annotator_agreement": 0.7667, "reliability": PREFERENCE_BINS, "ece": 0.08},
        "order": {"kind": "ranking", "labels": ["Response A", "Response B", "Response C"], "n": 12, "missing": 0,
                  "agreement": 0.8611, "kendall_tau": 0.7222, "spearman": 0.7917, "top_agreement": 0.9, "decided": 10,
                  "reliability": PREFERENCE_BINS, "ece": 0.11}}}


def _progress(store, run_id: int) -> None:
    """Two epochs of four steps each, as hf-text-classification reports them, and a validation loss after each
    epoch (a ``validation`` event, and the other shape: ``validation_loss`` in the epoch's last progress)."""
    for step, loss in enumerate((0.69, 0.61, 0.52, 0.47, 0.40, 0.33, 0.30, 0.28), start=1):
        event = {"phase": "train", "step": step, "total": 8, "epoch": step / 4, "loss": loss, "schema": "sentiment"}
        if step == 8:
            event["validation_loss"] = 0.36
        store.add_event(run_id, "progress", event, t=NOON_UTC + step)
        if step == 4:
            store.add_event(run_id, "validation", {"epoch": 1, "loss": 0.45, "schema": "sentiment"}, t=NOON_UTC + 4)


def _model(artifacts: Path) -> None:
    """A complete full fine-tune's files, as far as a download looks at them."""
    model = artifacts / "sentiment"
    model.mkdir(parents=True)
    (model / "labels.json").write_text(json.dumps({"kind": "full", "labels": ["positive", "negative"]}))
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")


@pytest.fixture
def server(tmp_path, monkeypatch):
    from potato.config import load_config
    from potato.runs.paths import open_store, private_dir, run_paths
    from potato.runs.run_events import record
    from potato.runs.runlog import RunLog
    from tests.support.potato_project import make_project
    from tests.support.runs import served
    from tests.unit.test_server_support import BACKENDS

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "no-hub-login"))  # no token stored by `hf auth login` either
    path = make_project(tmp_path, n_items=20, model_training={
        "enabled": True, "backend": "local", "backends": BACKENDS, "grace_seconds": 7,
        "writeback": {"schemas": ["sentiment"]}})
    config = load_config(path)
    store = open_store(config)

    done = store.create_run("hf-text-classification", ["sentiment"], "local")  # run 1: succeeded
    store.transition(done.id, "running", from_states="queued", started_at=NOON_UTC)
    _progress(store, done.id)
    directory = run_paths(config, done.id).dir
    private_dir(directory)
    (directory / "evaluation.json").write_text(json.dumps(_evaluation(done.id)))
    _model(directory / "artifacts")
    store.transition(done.id, "succeeded", from_states="running", finished_at=NOON_UTC + 60,
                     artifact_uri=str(directory / "artifacts"),
                     scores={"sentiment": {"kind": "nominal", "accuracy": 0.8222, "macro_f1": 0.8216, "n": 45}})

    cancelled = store.create_run("hf-text-classification", ["sentiment"], "local")  # run 2: cancelled from the page
    store.transition(cancelled.id, "running", from_states="queued", started_at=NOON_UTC)
    store.update_run(cancelled.id, cancel_requested_at=NOON_UTC + 5)
    store.add_event(cancelled.id, "cancel", {"by": "from the Training page (Cancel run)"})
    store.transition(cancelled.id, "cancelled", from_states="running", finished_at=NOON_UTC + 9,
                     error="Cancelled from the Training page (Cancel run)")
    private_dir(run_paths(config, cancelled.id).dir)

    training = store.create_run("hf-text-classification", ["sentiment"], "local")  # run 3: training, 3 of 10 steps
    store.transition(training.id, "running", from_states="queued")
    record(store, training.id, RunLog(store, training.id, run_paths(config, training.id).run_log),
           {"type": "progress", "seq": 1, "phase": "train", "step": 3, "total": 10, "epoch": 0.3, "loss": 0.61,
            "eta_s": 41.7, "schema": "sentiment"})

    store.create_run("hf-text-classification", ["sentiment"], "local")  # run 4: queued (no dispatcher here)

    with served(config, background=False) as url:
        yield url, store


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"run-page-{name}.png"), full_page=True)


def test_a_run_is_judged_from_its_page_and_the_training_page_refuses_and_asks_first(browser, server):  # noqa: F811
    from playwright.sync_api import expect

    from potato.publish.publish_errors import NoHubToken
    from potato.training.trainers.hf_llm_finetune import NO_MODEL_MESSAGE

    url, store = server
    context = browser.new_context(timezone_id="Europe/Berlin")
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{url}/admin/training/runs/1")
    page.get_by_label("Admin key").fill("test-admin-key")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Run 1")).to_be_visible()
    expect(page.locator("#run-started")).to_have_text("2025-01-15 13:00:00 UTC+01:00")

    # The loss from zero, both epochs marked, the validation loss after each.
    chart = page.locator("#loss-chart")
    expect(chart.locator("line.epoch")).to_have_count(2)
    assert chart.locator("text.epoch-label").all_text_contents() == ["epoch 1", "epoch 2"]
    expect(chart.locator("polyline.validation")).to_have_count(1)
    expect(chart.locator("circle.validation-point")).to_have_count(2)
    assert "0" in chart.locator("text").all_text_contents()
    expect(page.locator("#loss-caption")).to_have_text(
        "8 points; loss went from 0.6900 to 0.2800 by step 8 (2 epochs marked). "
        "Validation loss (dots, once per epoch): 0.4500, 0.3600.")
    expect(page.locator("#run-log")).to_contain_text("INFO validation loss 0.4500 after epoch 1")

    # Accuracy beside the trivial baseline; precision, recall and F1 per label.
    expect(page.locator("#evaluation .baseline")).to_have_text(
        "Accuracy 0.822; always answering “positive” (the most common label of these 45 held-out items) "
        "scores 0.556.")
    rows = page.locator("table.label-scores tr")
    assert [rows.nth(i).locator("th, td").all_text_contents() for i in range(3)] == [
        ["Label", "Held out", "Predicted", "Precision", "Recall", "F1"],
        ["positive", "25", "23", "0.870", "0.800", "0.833"],
        ["negative", "20", "22", "0.773", "0.850", "0.810"]]

    # The reliability diagram: bars before and after calibration, the items in each bin, ECE before and after.
    diagram = page.get_by_role("img", name="Reliability diagram of sentiment")
    expect(diagram.locator("rect.before")).to_have_count(3)
    expect(diagram.locator("rect.after")).to_have_count(2)
    assert diagram.locator("text.before-count").all_text_contents() == ["4", "11", "30"]
    assert diagram.locator("text.after-count").all_text_contents() == ["9", "36"]
    expect(diagram.locator("text.ece")).to_have_text("ECE 0.120 before, 0.030 after calibration")
    # A comparison: agreement with the majority and with each annotator, and how sure its preferences were.
    agreements = page.locator("#evaluation p.agreement")
    expect(agreements.nth(0)).to_have_text(
        "Prefers the annotators' majority on 0.850 of 20 held-out comparisons with one (2 split evenly); agrees "
        "with 0.767 of each annotator's choices.")
    # A ranking: its orders' pairs, the rank correlations with the annotators' Borda count, and first place.
    expect(agreements.nth(1)).to_have_text(
        "Orders 0.861 of the pairs in held-out annotators' orders as they did; Kendall's tau with their Borda count "
        "0.722, Spearman's rho 0.792; puts first the label their Borda count puts first on 0.900 of 10 held-out "
        "items with one.")
    expect(page.get_by_role("img", name="Reliability diagram of order")).to_be_visible()
    preference = page.get_by_role("img", name="Reliability diagram of pref")
    assert preference.locator("text.before-count").all_text_contents() == ["6", "14"]

    # The model's download is offered; without a token, publishing says so quietly (no error over the run).
    expect(page.get_by_role("link", name="Download the model and its card (.tar.gz)")).to_be_visible()
    expect(page.locator("#publish-refusal")).to_be_hidden()
    note = page.locator("#publish-hub-note")
    expect(note).to_have_text(str(NoHubToken()))
    expect(note).to_have_class("hint")
    _shot(page, "1-succeeded")
    with page.expect_download() as download:
        page.get_by_role("link", name="Download the model and its card (.tar.gz)").click()
    assert download.value.suggested_filename.endswith(".tar.gz")

    # A cancelled run says who cancelled it and when, and promises no artifacts.
    page.goto(f"{url}/admin/training/runs/2")
    expect(page.locator("#run-state")).to_have_text("cancelled")
    expect(page.locator("#run-error")).to_have_text(
        "Cancelled from the Training page (Cancel run) (requested 2025-01-15 13:00:05 UTC+01:00)")
    expect(page.locator("#artifacts")).to_have_text("None: the run was cancelled before it saved a model.")
    expect(page.locator("#run-artifact-uri")).to_have_text("none: the run was cancelled before it saved a model")
    expect(page.locator("#loss-caption")).to_have_text(
        "The run reported no training progress: it was cancelled before it trained.")
    expect(page.locator("#run-log")).to_contain_text("WARNING Cancel requested from the Training page (Cancel run)")
    expect(page.locator("#publish")).to_be_hidden()
    _shot(page, "2-cancelled")

    # A training run's step says about how long is left, on its page and in the Runs table.
    page.goto(f"{url}/admin/training/runs/3")
    expect(page.locator("#run-step")).to_have_text(
        "training: step 3 of 10 (epoch 0.3), loss 0.6100, about 40 s left")
    page.goto(f"{url}/admin/training")
    expect(page.locator("#step-text-3")).to_have_text(
        "training: step 3 of 10 (epoch 0.3), loss 0.6100, about 40 s left")

    # Cancel asks first: dismissed, the run stays queued; accepted, it is cancelled, from the page.
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.get_by_role("button", name="Cancel run 4").click()
    expect(page.locator("#run-4 .col-state")).to_have_text("queued")
    assert asked == ["Cancel run 4? A queued run ends at once; a running one's worker gets SIGTERM, then SIGKILL "
                     "after 7 s. A cancelled run keeps no model and writes no predictions back."]
    assert store.get_run(4).state == "queued"
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel run 4").click()
    expect(page.locator("#run-4 .col-state")).to_have_text("cancelled")
    assert store.get_run(4).error == "Cancelled before it started, from the Training page (Cancel run)"

    # A run its trainer would fail is refused at the start button, naming where to set what it lacks.
    page.get_by_label("Trainer").select_option("hf-llm-finetune")
    page.get_by_role("button", name="Start run").click()
    expect(page.locator("#start-message")).to_have_text(NO_MODEL_MESSAGE)
    expect(page.locator("#start-message")).to_have_class("error")
    assert store.count_runs() == 4
    _shot(page, "3-training-page")
    context.close()
