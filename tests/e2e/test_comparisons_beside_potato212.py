"""Pairwise comparisons, from annotators answering in the real Potato 2.12.1 to a trained reward model's predictions.

A project of customer questions, each with two replies (one offers a
remedy, one brushes the customer off, at a random place in the item), with
two pairwise schemas — ``pref`` (binary, ties allowed, each annotator shown
the pair in an order of their own) and ``grade`` (a scale from -3 to 3) — is
annotated by three annotators **through 2.12.1's own endpoints**: each reads
the pair as 2.12.1's page hands it over (``<script id="instance_data">``, in
the order that annotator sees) and posts ``pref:selection`` (``A``, ``B`` or
``tie``) and ``grade:scale_value`` to ``/updateinstance``, as its page does.
Then:

- the bundle holds each item's counts on the item's own order of its replies
  — the annotators who saw them swapped counted for the side they meant —
  and both replies (always runs);
- one training run of both schemas, with no trainer named (the default for a
  comparison is ``hf-reward-model``), succeeds, its holdout scores carry the
  comparison metrics, and every item with two replies gets a prediction per
  schema: the preferred side, its probability and each side's score.

Cost (2 cores): about 15 s to annotate (one 2.12.1 start) and about a minute
for the run (a tiny model, a few epochs: this is not the learning test, which
is tests/integration/test_reward_model.py), plus the session's Prefect API.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import yaml

from potato.bundle.build import build_bundle
from potato.config import load_config
from potato.runs.paths import open_store, run_paths
from tests.support.potato212 import Annotator, Potato212Server
from tests.support.runs import potato, processes_matching
from tests.support.tiny_model import build_tiny_model

pytestmark = [pytest.mark.potato212, pytest.mark.prefect, pytest.mark.training]

N_ITEMS, N_LABELLED = 24, 16
THINGS = ["kettle", "parcel", "phone", "bike", "lamp", "chair"]
_INSTANCE_DATA = re.compile(r'<script id="instance_data" type="application/json">(.*?)</script>', re.S)


def _item(i: int) -> dict:
    thing = THINGS[i % len(THINGS)]
    good = f"Sorry about your {thing}: we will send a refund or a repair today."
    bad = f"Your {thing} is not our problem, read the manual."
    good_first = random.Random(i).random() < 0.5
    return {"id": f"q{i:02d}", "text": f"My {thing} broke after a week. What now?",
            "replies": [good, bad] if good_first else [bad, good], "good": "A" if good_first else "B"}


def _project(root: Path, model: Path) -> Path:
    with open(root / "questions.jsonl", "w", encoding="utf-8") as f:
        for i in range(N_ITEMS):
            item = _item(i)
            f.write(json.dumps({key: item[key] for key in ("id", "text", "replies")}) + "\n")
    options = {"model": str(model), "max_length": 64, "epochs": 8, "learning_rate": 1e-3, "batch_size": 8}
    config = {
        "annotation_task_name": "Support replies",
        "task_dir": ".",
        "data_files": ["questions.jsonl"],
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
        ],
        "model_training": {"enabled": False, "split_seed": 3, "splits": {"train": 0.6, "val": 0.1, "test": 0.3},
                           "trainers": {"hf-reward-model": options},
                           # Not for 2.12 (it pre-fills no comparison): the pairs nobody compared get predictions too.
                           "writeback": {"include_unlabeled": True}},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _answer(annotator: Annotator, who: int) -> tuple[str, bool]:
    """Answer the item on screen as its page would post it: the remedy, wherever it is shown; carol ties one in
    four. Returns the item and whether this annotator was shown its replies swapped."""
    page = annotator.page()
    item = annotator.current()
    shown = json.loads(_INSTANCE_DATA.search(page).group(1))["replies"]
    source = _item(int(item[1:]))["replies"]
    good_shown = "A" if "refund" in shown[0] else "B"
    choice = "tie" if who == 2 and int(item[1:]) % 4 == 0 else good_shown
    strength = 1 if who == 2 else 2
    # The scale has no randomize_order: its sides are the item's own.
    scale = -strength if _item(int(item[1:]))["good"] == "A" else strength
    answer = json.loads(annotator._post_json("/updateinstance", {
        "instance_id": item, "annotations": {"pref:selection": choice, "grade:scale_value": str(scale)},
        "client_timestamp": "2026-01-01T00:00:00Z"}))
    assert answer.get("status") == "success", answer
    annotator.next()
    return item, shown != source


@pytest.fixture(scope="module")
def annotated(potato212, tmp_path_factory):
    """The project, annotated by three annotators through 2.12.1; 2.12.1 is left stopped."""
    root = tmp_path_factory.mktemp("replies")
    texts = [_item(i)["text"] + " " + " ".join(_item(i)["replies"]) for i in range(N_ITEMS)]
    config = _project(root, build_tiny_model(root / "tiny-model", texts))
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
    return config


def test_each_comparison_potato_212_stored_counts_for_the_reply_the_annotator_meant(annotated, tmp_path):
    config = load_config(annotated)
    build_bundle(config, ["pref", "grade"], tmp_path / "bundle", holdout_fraction=0.0)
    items = {item["id"]: item for item in map(json.loads, (tmp_path / "bundle" / "items.jsonl").read_text(
        "utf-8").splitlines())}
    for i in range(N_ITEMS):
        truth, item = _item(i), items[f"q{i:02d}"]
        assert item["sides"] == {"pref": truth["replies"], "grade": truth["replies"]}
        if i >= N_LABELLED:
            assert item["labels"] == {}
            continue
        ties = 1 if i % 4 == 0 else 0
        assert item["labels"]["pref"] == {"A": 0, "B": 0, "tie": ties, truth["good"]: 3 - ties}, item
        assert item["labels"]["grade"] == {"A": 0, "B": 0, "tie": 0, truth["good"]: 3}, item


def test_one_run_trains_both_comparisons_and_predicts_every_pair(annotated, prefect_api):
    done = potato("training", "run", str(annotated), "--schema", "pref", "--schema", "grade", timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = int(re.search(r"Run (\d+) queued: hf-reward-model on pref, grade", done.stdout).group(1))
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
    for schema, lines in by_schema.items():
        assert sorted(lines) == [f"q{i:02d}" for i in range(N_ITEMS)], schema
        for line in lines.values():
            a, b = line["probs"]
            assert line["label"] == ("B" if b >= 0.5 else "A") and line["confidence"] == max(a, b)
            assert len(line["rewards"]) == 2
    run_log = run_paths(config, run_id).run_log.read_text("utf-8")
    assert "Schema 'pref': " in run_log and "comparisons of two responses (A, B or neither)" in run_log
    assert processes_matching(str(annotated.parent)) == []
