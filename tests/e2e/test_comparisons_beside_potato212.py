"""Pairwise and ranking answers, from annotators answering in the real Potato 2.12.1 to a reward model's predictions.

A project of customer questions, each with two replies (one offers a
remedy, one brushes the customer off, at a random place in the item), with
two pairwise schemas — ``pref`` (binary, ties allowed, each annotator shown
the pair in an order of their own) and ``grade`` (a scale from -3 to 3) —
and a ranking schema ``rank`` over three more replies the item holds in
fields named by its labels (``Reply 1`` … ``Reply 3``: a remedy, a promise
to look into it, a brush-off, in an order of the item's own), is annotated
by three annotators **through 2.12.1's own endpoints**: each reads the pair
as 2.12.1's page hands it over (``<script id="instance_data">``, in the
order that annotator sees) and posts ``pref:selection`` (``A``, ``B`` or
``tie``), ``grade:scale_value`` and ``rank:rank_order`` (the labels, best
first, joined by commas, as the ranking widget's hidden input holds them)
to ``/updateinstance``, as its page does. Then:

- the bundle holds each item's counts on the item's own order of its replies
  — the annotators who saw them swapped counted for the side they meant —
  both replies, each annotator's order and the three ranked replies (always
  runs);
- one training run of the three schemas, with no trainer named (the default
  for a comparison and a ranking is ``hf-reward-model``), succeeds, its
  holdout scores carry the comparison and the ranking metrics, and every
  item gets a prediction per schema: the preferred side, its probability and
  each side's score; the order of the three replies and each one's score.
- the run writes them back under ``assignment_strategy: model_review`` (the
  config is switched to it once the answers are in, as a lead does to have
  the rest reviewed): a new annotator is served every item written back, the
  ones the model is least sure of first (by margin, the default order), each
  holding the model's own probability and no answer — and 2.12.1's page, in
  Chromium, shows no reply chosen, the scale at its middle and the ranking
  unset.

Cost (2 cores): about 15 s to annotate (one 2.12.1 start), about a minute
for the run (a tiny model, a few epochs: this is not the learning test, which
is tests/integration/test_reward_model.py), about 15 s to be served the
order (a second 2.12.1 start and a browser), plus the session's Prefect API.
"""

from __future__ import annotations

import html
import json
import random
import re
from pathlib import Path

import pytest
import yaml

from potato.bundle.build import build_bundle
from potato.config import load_config
from potato.prefill.review_order import ORDER_KEY
from potato.runs.paths import open_store, run_paths
from potato.training.trainers.uncertainty import MARGIN, of_probs
from tests.e2e.test_training_page import browser  # noqa: F401 - the module's Chromium fixture
from tests.support.potato212 import Annotator, Potato212Server
from tests.support.runs import potato, processes_matching
from tests.support.tiny_model import build_tiny_model

pytestmark = [pytest.mark.potato212, pytest.mark.prefect, pytest.mark.training, pytest.mark.browser]

N_ITEMS, N_LABELLED = 24, 16
RANK_LABELS = ["Reply 1", "Reply 2", "Reply 3"]
THINGS = ["kettle", "parcel", "phone", "bike", "lamp", "chair"]
_INSTANCE_DATA = re.compile(r'<script id="instance_data" type="application/json">(.*?)</script>', re.S)
_INSTANCE_JSON = re.compile(r"data-instance-json='([^']*)'")
SCHEMAS = ("pref", "grade", "rank")


def _item(i: int) -> dict:
    thing = THINGS[i % len(THINGS)]
    good = f"Sorry about your {thing}: we will send a refund or a repair today."
    bad = f"Your {thing} is not our problem, read the manual."
    good_first = random.Random(i).random() < 0.5
    ranked = [good, f"We will look into your {thing} next week.", f"Nobody here can help with a {thing}."]
    places = random.Random(i + 100).sample(range(3), 3)  # ranked[k] is the item's reply places[k]
    replies = {RANK_LABELS[places[k]]: ranked[k] for k in range(3)}
    return {"id": f"q{i:02d}", "text": f"My {thing} broke after a week. What now?",
            "replies": [good, bad] if good_first else [bad, good], "good": "A" if good_first else "B",
            **dict(sorted(replies.items())), "best_first": [RANK_LABELS[p] for p in places]}


def _project(root: Path, model: Path, review: bool = False) -> Path:
    """The project's config: annotated as 2.12.1 serves by default; with *review*, served by model_review
    from the predictions written back into the items' own records."""
    (root / "questions").mkdir(exist_ok=True)
    with open(root / "questions" / "questions.jsonl", "w", encoding="utf-8") as f:
        for i in range(N_ITEMS):
            item = _item(i)
            f.write(json.dumps({key: item[key] for key in ("id", "text", "replies", *RANK_LABELS)}) + "\n")
    options = {"model": str(model), "max_length": 64, "epochs": 8, "learning_rate": 1e-3, "batch_size": 8}
    config = {
        "annotation_task_name": "Support replies",
        "task_dir": ".",
        "data_directory": "questions",
        "item_properties": {"id_key": "id", "text_key": "text"},
        "output_annotation_dir": "annotations",
        "admin_api_key": "replies-admin",
        "user_config": {"allow_all_users": True},
        "require_password": False,
        "annotation_schemes": [
            {"annotation_type": "pairwise", "name": "pref", "description": "Which reply is better?",
             "items_key": "replies", "allow_tie": True, "randomize_order": True},
            {"annotation_type": "pairwise", "name": "grade", "description": "How much better?", "mode": "scale",
             "items_key": "replies"},
            {"annotation_type": "ranking", "name": "rank", "description": "Order the three replies, best first",
             "labels": RANK_LABELS},
        ],
        "model_training": {"enabled": False, "split_seed": 3, "splits": {"train": 0.6, "val": 0.1, "test": 0.3},
                           "trainers": {"hf-reward-model": options},
                           # The pairs nobody compared get predictions too.
                           "writeback": {"include_unlabeled": True}},
    }
    if review:
        config.update({"assignment_strategy": "model_review", "pre_annotation": {"enabled": True},
                       "watch_data_directory": True, "watch_poll_interval": 1})
        # The gate off: a tiny model in 8 epochs on 16 items may not beat a side's position; the order is the point.
        config["model_training"]["writeback"].update(schemas=list(SCHEMAS), live=True, gate=False)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _answer(annotator: Annotator, who: int, then_next: bool = True) -> tuple[str, bool]:
    """Answer the item on screen as its page would post it: the remedy, wherever it is shown; carol ties one in
    four, and swaps the last two of one order in four; then (*then_next*) go to the next item. Returns the item
    and whether this annotator was shown its replies swapped."""
    page = annotator.page()
    item = annotator.current()
    shown = json.loads(_INSTANCE_DATA.search(page).group(1))["replies"]
    source = _item(int(item[1:]))["replies"]
    good_shown = "A" if "refund" in shown[0] else "B"
    choice = "tie" if who == 2 and int(item[1:]) % 4 == 0 else good_shown
    strength = 1 if who == 2 else 2
    # The scale has no randomize_order: its sides are the item's own.
    scale = -strength if _item(int(item[1:]))["good"] == "A" else strength
    order = _order(int(item[1:]), who)
    answer = json.loads(annotator._post_json("/updateinstance", {
        "instance_id": item, "annotations": {"pref:selection": choice, "grade:scale_value": str(scale),
                                             "rank:rank_order": ",".join(order)},
        "client_timestamp": "2026-01-01T00:00:00Z"}))
    assert answer.get("status") == "success", answer
    if then_next:
        annotator.next()
    return item, shown != source


def _order(i: int, who: int) -> list[str]:
    """The labels of item *i*'s ranked replies as annotator *who* orders them, best first."""
    order = list(_item(i)["best_first"])
    if who == 2 and i % 4 == 1:
        order[1], order[2] = order[2], order[1]
    return order


@pytest.fixture(scope="module")
def annotated(potato212, tmp_path_factory):
    """The project, annotated by three annotators through 2.12.1; 2.12.1 is left stopped."""
    root = tmp_path_factory.mktemp("replies")
    texts = [" ".join([_item(i)["text"], *_item(i)["replies"], *(_item(i)[label] for label in RANK_LABELS)])
             for i in range(N_ITEMS)]
    model = build_tiny_model(root / "tiny-model", texts)
    config = _project(root, model)
    server = Potato212Server(potato212, config, root / "potato212.log").start()
    swapped = 0
    try:
        for who, name in enumerate(("alice", "bob", "carol")):
            annotator = Annotator(server, name)
            answered = [_answer(annotator, who) for _ in range(N_LABELLED)]
            swapped += sum(was_swapped for _, was_swapped in answered)
        assert sorted(item for item, _ in answered) == [f"q{i:02d}" for i in range(N_LABELLED)]
    finally:
        server.stop()
    assert swapped, "2.12.1 showed no annotator a pair swapped: the order is not being tested"
    return _project(root, model, review=True)


@pytest.fixture(scope="module")
def trained(annotated, prefect_api) -> int:
    """One run of the three schemas, with no trainer named; its id."""
    done = potato("training", "run", str(annotated), "--schema", "pref", "--schema", "grade", "--schema", "rank",
                  timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return int(re.search(r"Run (\d+) queued: hf-reward-model on pref, grade, rank", done.stdout).group(1))


def test_each_comparison_potato_212_stored_counts_for_the_reply_the_annotator_meant(annotated, tmp_path):
    config = load_config(annotated)
    build_bundle(config, ["pref", "grade", "rank"], tmp_path / "bundle", holdout_fraction=0.0)
    items = {item["id"]: item for item in map(json.loads, (tmp_path / "bundle" / "items.jsonl").read_text(
        "utf-8").splitlines())}
    for i in range(N_ITEMS):
        truth, item = _item(i), items[f"q{i:02d}"]
        assert item["sides"] == {"pref": truth["replies"], "grade": truth["replies"],
                                 "rank": [truth[label] for label in RANK_LABELS]}
        assert "prompts" not in item  # the replies are fields: the prompt is the item's text
        if i >= N_LABELLED:
            assert item["labels"] == {}
            continue
        assert item["labels"]["rank"] == sorted(_order(i, who) for who in range(3)), item
        ties = 1 if i % 4 == 0 else 0
        assert item["labels"]["pref"] == {"A": 0, "B": 0, "tie": ties, truth["good"]: 3 - ties}, item
        assert item["labels"]["grade"] == {"A": 0, "B": 0, "tie": 0, truth["good"]: 3}, item


def test_one_run_trains_the_comparisons_and_the_ranking_and_predicts_every_item(annotated, trained):
    run_id = trained
    config = load_config(annotated)
    run = open_store(config).get_run(run_id)
    assert run.state == "succeeded", run
    for schema in ("pref", "grade"):
        scores = run.scores[schema]
        assert scores["kind"] == "comparison" and scores["n"] > 0, scores
        assert {"agreement", "annotator_agreement", "decided"} <= set(scores), scores
    predictions = [json.loads(line) for line in
                   run_paths(config, run_id).predictions.read_text("utf-8").splitlines()]
    by_schema = {schema: {p["id"]: p for p in predictions if p["schema"] == schema} for schema in ("pref", "grade")}
    ranked = {p["id"]: p for p in predictions if p["schema"] == "rank"}
    assert sorted(ranked) == [f"q{i:02d}" for i in range(N_ITEMS)]
    for line in ranked.values():
        rewards = line["rewards"]
        assert line["order"] == [RANK_LABELS[k] for k in sorted(range(3), key=lambda k: -rewards[k])]
        assert line["label"] == line["order"][0]
    scores = run.scores["rank"]
    assert scores["kind"] == "ranking" and scores["n"] > 0, scores
    assert {"agreement", "kendall_tau", "spearman", "top_agreement", "baseline_agreement"} <= set(scores), scores
    for schema, lines in by_schema.items():
        assert sorted(lines) == [f"q{i:02d}" for i in range(N_ITEMS)], schema
        for line in lines.values():
            a, b = line["probs"]
            assert line["label"] == ("B" if b >= 0.5 else "A") and line["confidence"] == max(a, b)
            assert len(line["rewards"]) == 2
    run_log = run_paths(config, run_id).run_log.read_text("utf-8")
    assert "Schema 'pref': " in run_log and "comparisons of two responses (A, B or neither)" in run_log
    assert "orders of 3 (Reply 1, Reply 2, Reply 3)" in run_log
    assert processes_matching(str(annotated.parent)) == []


def _payloads(page: str) -> dict:
    """What 2.12.1 holds under ``predictions`` for the item on the page (its data-instance-json)."""
    found = _INSTANCE_JSON.search(page)
    assert found, "the annotate page has no data-instance-json"
    return json.loads(html.unescape(found.group(1))).get("predictions") or {}


# The page's answer, read after its scripts ran: the chosen tiles, and the inputs the page posts.
_PAGE_ANSWER = """() => ({chosen: [...document.querySelectorAll('[aria-checked="true"], .selected, input:checked')]
                            .map(e => e.outerHTML.slice(0, 120)),
                  inputs: Object.fromEntries([...document.querySelectorAll('input')]
                            .filter(e => /^(pref|grade|rank)/.test(e.name)).map(e => [e.name, e.value]))})"""


def test_potato_212_serves_the_comparisons_the_model_is_least_sure_of_first(annotated, trained, potato212,
                                                                          browser):  # noqa: F811
    config = load_config(annotated)
    predictions = [json.loads(line) for line in
                   run_paths(config, trained).predictions.read_text("utf-8").splitlines()]
    written = {json.loads(line)["id"] for line in config.writeback_file.read_text("utf-8").splitlines()}
    lines = {(p["id"], p["schema"]): p for p in predictions if p["id"] in written}
    assert {schema for _, schema in lines} == set(SCHEMAS) and len(written) > N_ITEMS - N_LABELLED
    # The default order, margin: an item's number is its least sure schema's, 1 - (first - second probability).
    number = {item: max(of_probs(MARGIN, lines[item, schema]["probs"]) for schema in SCHEMAS) for item in written}
    expected = sorted(written, key=lambda item: (-number[item], item))
    by_confidence = sorted(written, key=lambda item: (min(lines[item, s]["confidence"] for s in SCHEMAS), item))

    server = Potato212Server(potato212, annotated, annotated.parent / "potato212-review.log").start()
    try:
        with browser.new_context() as context:  # 2.12.1's own page, its scripts run: nothing is chosen
            context.request.post(server.url + "/auth", form={"email": "erin", "pass": ""})
            page = context.new_page()
            page.goto(server.url + "/annotate")
            page.wait_for_load_state("networkidle")
            assert page.locator("#instance_id").input_value() == expected[0]
            shown = page.evaluate(_PAGE_ANSWER)
            assert shown == {"chosen": [], "inputs": {"pref": "", "grade": "0", "rank:::rank_order": ""}}, shown
        dora, served = Annotator(server, "dora"), []
        while (item := dora.served()) is not None and len(served) <= len(written):
            payloads = _payloads(dora.page())
            for schema in SCHEMAS:  # the model's own probability, no answer
                kept = {k: v for k, v in payloads[schema].items() if k != ORDER_KEY}
                assert kept == {"confidence": lines[item, schema]["confidence"]}, (item, schema, payloads)
            served.append(item)
            assert _answer(dora, 0, then_next=False)[0] == item
            dora.press_next(item)
    finally:
        server.stop()
    assert served == expected, f"served {served}; by confidence alone it would be {by_confidence}"
    print(f"\ncomparisons under model_review: served {served} (by confidence alone: {by_confidence})")
    assert processes_matching(str(annotated.parent)) == []
