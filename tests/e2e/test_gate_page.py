"""The quality gate on the pages, in a real browser (headless Chromium), with no training: the runs' results
are recorded by the flow's own record-results step on generated predictions (``tests.unit.test_quality_gate``).

Run 1 is good and live, with a learning curve; run 2 gives one label to everything and is held back. The Training page must mark run
1 live and run 2 held back, and say under "What annotators see" why run 2 was not written back; run 2's page
must say it and offer Promote, which asks first and then makes run 2 what annotators see. Run 1's page draws
its learning curve with the verdict in words, and the Training page's Learning curve box asks for one.
"""

from __future__ import annotations

import pytest

from tests.e2e.test_training_page import ARTIFACTS, browser  # noqa: F401 - the module's Chromium fixture
from tests.unit.test_quality_gate import N_ITEMS, _record, _truth

pytestmark = [pytest.mark.browser]

CURVE = [{"share": 0.25, "items": 12, "accuracy": 0.7}, {"share": 0.5, "items": 24, "accuracy": 0.78},
         {"share": 0.75, "items": 36, "accuracy": 0.82}, {"share": 1.0, "items": 48, "accuracy": 0.85}]


@pytest.fixture
def server(tmp_path):
    from potato.config import load_config
    from potato.runs.paths import open_store
    from tests.support.potato_project import make_project
    from tests.support.runs import served

    path = make_project(tmp_path, n_items=N_ITEMS, labeled_fraction=0.8, disagree_every=0, model_training={
        "enabled": True, "holdout_fraction": 0.3, "writeback": {"schemas": ["sentiment"], "include_unlabeled": True}})
    _record(path, _truth)
    _record(path, lambda i: "negative")
    config = load_config(path)
    store = open_store(config)
    store.update_run(1, scores={"sentiment": {"kind": "nominal", "n": 20, "accuracy": 0.85, "macro_f1": 0.85,
                                              "curve": CURVE}})
    with served(config, background=False) as url:
        yield url, open_store(config), config


def test_the_pages_say_which_run_is_live_why_a_run_was_held_back_and_promote_it(browser, server):  # noqa: F811
    from playwright.sync_api import expect

    from potato.results import stability
    from potato.results.writeback import live_runs_by_schema

    url, store, config = server
    page = browser.new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{url}/admin/training")
    page.get_by_label("Admin key").fill("test-admin-key")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#run-1 .col-predictions")).to_have_text("live")
    expect(page.locator("#run-2 .col-predictions")).to_have_text("held back")
    why = (f"sentiment: every one of its {N_ITEMS} predictions is `negative`, though its training answers hold "
           "more than one; its predictions were not written back (`potato training promote "
           f"{config.path} 2` writes them back anyway)")
    expect(page.locator("#writeback-lines li.held-back")).to_have_text(f"Run 2 was not written back: {why}")
    expect(page.locator("#writeback-run")).to_have_text("The predictions of run 1, the newest written back:")
    # The stopping signal: run 2's predicted labels against run 1's, in the Runs table and under the writeback.
    (change,) = stability.read(config, 2)
    expect(page.locator("#run-2 .col-changed")).to_have_text(change.short())
    expect(page.locator("#writeback-lines li.changed")).to_have_text(change.describe())
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "gate-training-page.png"), full_page=True)

    page.goto(f"{url}/admin/training/runs/2")
    expect(page.locator("#gate-lines li")).to_have_text([why])
    promote = page.get_by_role("button", name="Promote: write these predictions back")
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    promote.click()
    expect(promote).to_be_enabled()
    assert asked == ["Write run 2's predictions back although the quality gate held them back? Annotators then "
                     "see them in place of the ones they see now."]
    assert live_runs_by_schema(config) == {"sentiment": 1}  # dismissed: nothing changed
    page.once("dialog", lambda dialog: dialog.accept())
    promote.click()
    expect(page.locator("#promote-status")).to_contain_text("Promoted: annotators see these predictions now. ")
    expect(promote).to_be_hidden()
    expect(page.locator("#gate-lines li").first).to_have_text("Annotators see this run's predictions now.")
    assert live_runs_by_schema(config) == {"sentiment": 2}
    page.screenshot(path=str(ARTIFACTS / "gate-run-page.png"), full_page=True)

    page.goto(f"{url}/admin/training")
    expect(page.locator("#run-2 .col-predictions")).to_have_text("live")
    expect(page.locator("#run-1 .col-predictions")).to_have_text("")
    expect(page.locator("#writeback-lines li.held-back")).to_have_count(0)
    expect(page.locator("#writeback-lines")).to_contain_text("Promoted past the quality gate by an admin on the "
                                                              "Training page")


def test_the_run_page_draws_the_learning_curve_and_the_training_page_asks_for_one(browser, server):  # noqa: F811
    from playwright.sync_api import expect

    url, store, _ = server
    page = browser.new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{url}/admin/training/runs/1")
    page.get_by_label("Admin key").fill("test-admin-key")
    page.get_by_role("button", name="Log in").click()
    figure = page.locator("#learning-curves figure.learning-curve")
    expect(figure.locator("circle.curve-point")).to_have_count(4)
    assert figure.locator("text.curve-label").all_text_contents() == ["25 % (12)", "50 % (24)", "75 % (36)",
                                                                     "100 % (48)"]
    expect(figure.locator("figcaption")).to_have_text(
        "sentiment: learning curve of accuracy, 25 % (12 items) 0.700, 50 % (24 items) 0.780, 75 % (36 items) "
        "0.820, 100 % (48 items) 0.850; still rising: +3.0 points of accuracy over the last quarter of the labels; "
        "more labels should help")
    page.screenshot(path=str(ARTIFACTS / "learning-curve-run-page.png"), full_page=True)

    page.goto(f"{url}/admin/training")
    page.get_by_label("Learning curve").check()
    page.get_by_role("button", name="Start run").click()
    expect(page.locator("#start-message")).to_have_text("Run 3 queued on local.")
    assert store.get_run(3).options == {"curve": True}
