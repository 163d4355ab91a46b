"""Under model_review a running Potato 2.12.1 serves items in the order's order: a cold start first, then a model's.

One real 2.12.1 (``assignment_strategy: model_review``, watching
``data_directory``) and this project's ``potato start`` beside it, on one
config whose ``model_training.writeback.order`` is ``diverse``. Reviewers work
only through 2.12.1's own endpoints (sign in, the annotate page, save, next):

1. Before anything is written back 2.12.1 serves nothing; ``potato start``
   queues the cold-start run by itself (trigger ``cold-start``), and a new
   reviewer is then served the items in the order of its order lines, each
   pre-filling nothing and holding no confidence.
2. After a run of ``hf-text-classification`` on the reviewer's labels, a new
   reviewer is served every item the run wrote back in the diverse order:
   the worker's order lines first (its most uncertain unlabelled items, the
   most uncertain of each k-means cluster of the model's embeddings of them
   leading), then the rest by
   margin (the gap between the two likeliest labels, computed here from the
   run's own ``predictions.jsonl``) — not the order of the confidences; each
   payload 2.12.1 holds (the page's ``data-instance-json``) has the model's
   own confidence and label. (Margin alone is ranked by the same code, tested
   against 2.12's rule in tests/unit/test_review_order.py; on 24 items a tiny
   model's margin and confidence orders are often the same.)

Cost (measured on 2 cores): about 45 s — one 2.12.1 start, one ``potato
start``, a cold start and a training run on the tiny model.
"""

from __future__ import annotations

import html
import json
import re
import urllib.request
from pathlib import Path

import pytest
import yaml

from potato.training.trainers.uncertainty import MARGIN, of_probs
from tests.support.potato212 import Annotator, OurServer, Potato212Server, project_config
from tests.support.runs import processes_matching, wait_for
from tests.support.tiny_model import build_tiny_model

pytestmark = [pytest.mark.potato212, pytest.mark.prefect, pytest.mark.training]

LABELS = ["calm", "angry", "unsure"]
TONE3 = {"annotation_type": "radio", "name": "tone", "description": "How does it sound?", "labels": LABELS}
TEXTS = {
    "calm": ["Thanks, the new release works well.", "All good now, lovely support.", "Kind thanks for the fix."],
    "angry": ["This is broken again, furious.", "Terrible service, still broken.", "Awful, nothing works."],
    "unsure": ["Not sure whether it works now.", "Maybe fixed, maybe not, unclear.", "Hard to say if it helped."],
}
N_ITEMS = 24
POLL_S = 1
API_KEY = "review-admin"
COLD_LABELLED = 10  # the first reviewer labels this many cold-start items, which the run then trains on
_INSTANCE_JSON = re.compile(r"data-instance-json='([^']*)'")


def _tone(i: int) -> str:
    return LABELS[i % 3]


def _text(i: int) -> str:
    return f"{TEXTS[_tone(i)][i % 2]} (ticket {i})"


def _configs(root: Path) -> Path:
    tickets = root / "tickets"
    tickets.mkdir(parents=True)
    (tickets / "a.jsonl").write_text("".join(
        json.dumps({"ticket_id": f"t{i:02d}", "body": _text(i)}) + "\n" for i in range(N_ITEMS)))
    import torch

    torch.manual_seed(7)  # the same random tiny model every time, so that the run goes as it went when written
    model = str(build_tiny_model(root / "tiny-model", [_text(i) for i in range(N_ITEMS)]))
    config = {
        **project_config("Review order", "tickets", "ticket_id", "body", API_KEY),
        "annotation_schemes": [TONE3],
        "watch_data_directory": True,
        "watch_poll_interval": POLL_S,
        "assignment_strategy": "model_review",
        "pre_annotation": {"enabled": True},
        "model_training": {
            "enabled": False,
            "split_seed": 3,
            "trainers": {"hf-text-classification": {"model": model, "max_length": 32},
                         "cold-start": {"model": model, "max_length": 32}},
            # The gate off: a tiny model on a dozen tickets may answer one tone for all; the order is the point.
            "writeback": {"schemas": ["tone"], "include_unlabeled": True, "live": True, "order": "diverse",
                          "order_batch": 5, "gate": False},
        },
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _run_dir(root: Path, run_id: int) -> Path:
    return root / "annotations" / "training" / "runs" / str(run_id)


def _lines(root: Path, run_id: int) -> list[dict]:
    return [json.loads(line) for line in (_run_dir(root, run_id) / "predictions.jsonl").read_text().splitlines()]


def _payload(page: str) -> dict | None:
    """What 2.12.1 holds under ``predictions`` for the item on the page (its data-instance-json)."""
    found = _INSTANCE_JSON.search(page)
    assert found, "the annotate page has no data-instance-json"
    return json.loads(html.unescape(found.group(1))).get("predictions")


def _served_in_turn(reviewer: Annotator, count: int) -> list[tuple[str, dict | None, list[str]]]:
    """Label *count* items as 2.12.1 serves them: (id, its predictions there, the radios it showed checked)."""
    seen = []
    for _ in range(count):
        page = reviewer.page()
        item = reviewer.served()
        if item is None:
            break
        seen.append((item, _payload(page), reviewer.checked(page, "tone")))
        reviewer.label("tone", _tone(int(item[1:])))
        reviewer.press_next(item)
    return seen


def _start_run(ours: OurServer, body: dict) -> int:
    request = urllib.request.Request(ours.url + "/runs", data=json.dumps(body).encode(), method="POST",
                                     headers={"X-API-Key": API_KEY, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["run"]["id"]


def _ended(ours: OurServer, run_id: int) -> dict | None:
    run = next((r for r in ours.runs() if r["id"] == run_id), None)
    return run if run and run["state"] in ("succeeded", "failed", "cancelled") else None


def test_potato_212_serves_the_cold_start_then_the_diverse_order(potato212, prefect_api, tmp_path):
    config = _configs(tmp_path)
    review = Potato212Server(potato212, config, tmp_path / "potato212-review.log").start()
    ours = None
    try:
        assert Annotator(review, "early").served() is None  # nothing written back: model_review serves nothing

        # potato start queues the cold start by itself; 2.12.1 then serves its order, pre-filling nothing.
        ours = OurServer(config, tmp_path / "potato-start.log", API_KEY)
        cold = wait_for(lambda: _ended(ours, 1), 180, "the cold-start run to end")
        assert (cold["trigger"], cold["trainer"], cold["state"]) == ("cold-start", "cold-start", "succeeded"), \
            (_run_dir(tmp_path, 1) / "run.log").read_text()
        assert "Cold start: run 1 orders the unlabelled items of tone" in ours.log.read_text()
        cold_order = [line["id"] for line in sorted(_lines(tmp_path, 1), key=lambda line: line["order_rank"])]
        assert sorted(cold_order) == [f"t{i:02d}" for i in range(N_ITEMS)]
        probes = iter(range(100))
        rita = wait_for(lambda: (a := Annotator(review, f"rita{next(probes)}")).served() == cold_order[0] and a,
                        POLL_S + 5, f"a new reviewer to be served {cold_order[0]} first")
        served = _served_in_turn(rita, COLD_LABELLED)
        assert [item for item, _, _ in served] == cold_order[:COLD_LABELLED]
        for item, payload, checked in served:
            assert checked == [] and "confidence" not in payload["tone"], (item, payload)
            assert payload["tone"]["review_order"]["by"] == "cold-start"

        # A run on rita's labels: 2.12.1 now serves what it wrote back in the diverse order.
        run_id = _start_run(ours, {"trainer": "hf-text-classification", "schemas": ["tone"],
                                   "options": {"epochs": 20, "learning_rate": 3e-3, "batch_size": 8}})
        run = wait_for(lambda: _ended(ours, run_id), 240, "the training run to end")
        assert run["state"] == "succeeded", (_run_dir(tmp_path, run_id) / "run.log").read_text()
        written = {json.loads(line)["id"] for line in
                   (tmp_path / "annotations" / "training" / "predictions.jsonl").read_text().splitlines()}
        lines = [line for line in _lines(tmp_path, run_id) if line["id"] in written]
        predicted = {line["id"]: line for line in lines if "label" in line}
        assert len(predicted) == len(written) > COLD_LABELLED  # the trained-on items are left out (leak guard)
        spread = [line["id"] for line in sorted((line for line in lines if "order_rank" in line),
                                                key=lambda line: line["order_rank"])]
        assert spread and len(spread) == len(set(spread))
        expected = spread + sorted((i for i in predicted if i not in spread),
                                 key=lambda i: (-of_probs(MARGIN, predicted[i]["probs"]), i))
        by_confidence = sorted(predicted, key=lambda i: (predicted[i]["confidence"], i))
        assert expected != by_confidence, "the data do not tell the order from least-confidence; change them"

        probes = iter(range(100))
        vera = wait_for(lambda: (a := Annotator(review, f"vera{next(probes)}")).served() == expected[0] and a,
                        POLL_S + 5, f"a new reviewer to be served {expected[0]} (the order's first) first")
        served = _served_in_turn(vera, len(expected) + 1)
        assert [item for item, _, _ in served] == expected
        for item, payload, checked in served:  # each payload's label and confidence are the model's own
            assert (payload["tone"]["label"], payload["tone"]["confidence"]) == (
                predicted[item]["label"], predicted[item]["confidence"]), item
            assert checked == [predicted[item]["label"]] and payload["tone"]["review_order"]["by"] == "diverse"
        print(f"\nreview order: cold start served {cold_order[:COLD_LABELLED]}; after run {run_id}, diverse served "
              f"{expected} (by confidence it would be {by_confidence})")
    finally:
        if ours is not None:
            ours.stop()
        review.stop()
    assert processes_matching(str(tmp_path)) == []
