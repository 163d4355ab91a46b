"""The worker's part of the model_review order: the diverse strategy's order lines, and the cold start.

Each test runs the real worker as a subprocess, offline, on the tiny model
(tests/support/tiny_model.py) and reads its ``predictions.jsonl``. Not a
learning test: the options are the tiny model's, to keep it to seconds.

Cost (measured on 2 cores): about 15 s for the three.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from potato.training.trainers.uncertainty import MARGIN, of_probs
from tests.integration.test_worker import TINY, events_of, run_worker
from tests.support.bundles import easy_items, write_job
from tests.support.tiny_model import tiny_model_path

pytestmark = pytest.mark.training


def _lines(job: Path) -> list[dict]:
    return [json.loads(line) for line in (job / "predictions.jsonl").read_text().splitlines()]


def test_the_diverse_order_ranks_the_most_uncertain_unlabelled_items_after_the_predictions(tmp_path):
    items = easy_items(60, unlabeled=30)
    job = write_job(tmp_path / "job", items=items, options={**TINY, "epochs": 3, "model": str(tiny_model_path())},
                    order={"strategy": "diverse", "batch": 4})
    result = run_worker(job)
    assert result.returncode == 0, result.stderr
    lines = _lines(job)
    predictions = [line for line in lines if "label" in line]
    ranks = [line for line in lines if "order_rank" in line]
    assert lines[:len(predictions)] == predictions  # the order lines come after the predictions
    assert all("probs" in line for line in predictions)  # every item's, for margin and entropy
    unlabelled = {it["id"] for it in items if not it["labels"]}
    numbers = {line["id"]: of_probs(MARGIN, line["probs"]) for line in predictions if line["id"] in unlabelled}
    top = sorted(numbers, key=lambda i: (-numbers[i], i))[:20]  # POOL_FACTOR (5) x batch (4)
    assert [line["order_rank"] for line in ranks] == list(range(20))
    assert sorted(line["id"] for line in ranks) == sorted(top)
    assert {tuple(sorted(line)) for line in ranks} == {("id", "order_rank", "schema")}
    said = [e["message"] for e in events_of(job) if e.get("type") == "log"]
    assert ("Schema 'sentiment': diverse order: the 20 most uncertain of 30 unlabelled items (margin) go first, "
            "the most uncertain of each of 4 clusters of the model's embeddings of them (k-means) leading") in said


def test_the_cold_start_orders_every_unlabelled_item_and_predicts_nothing(tmp_path):
    items = easy_items(40, unlabeled=25)
    job = write_job(tmp_path / "job", items=items, trainer="cold-start",
                    options={"model": str(tiny_model_path()), "max_length": 32}, order={"strategy": "margin",
                                                                                       "batch": 2})
    result = run_worker(job)
    assert result.returncode == 0, result.stderr
    lines = _lines(job)
    unlabelled = [it["id"] for it in items if not it["labels"]]
    assert [line["order_rank"] for line in lines] == list(range(25))
    assert sorted(line["id"] for line in lines) == sorted(unlabelled)
    assert all(set(line) == {"id", "schema", "order_rank"} for line in lines)
    assert json.loads((job / "scores.json").read_text()) == {}
    said = [e["message"] for e in events_of(job) if e.get("type") == "log"]
    assert any(m.startswith("Cold start: 25 unlabelled and 40 labelled items, embedded by ") for m in said)
    assert ("Cold start: 25 items in order for sentiment: the first 20 by typical clustering of the encoder's "
            "embeddings (batches of 2), the rest by distance to those") in said


def test_a_job_with_an_order_no_worker_knows_fails_naming_it(tmp_path):
    job = write_job(tmp_path / "job", items=easy_items(10), order={"strategy": "random"})
    result = run_worker(job, timeout=60)
    done = [e for e in events_of(job) if e.get("type") == "done"][-1]
    assert (result.returncode, done["error"]) == (1, "Job: order.strategy is 'random'; expected one of "
                                                     "least-confidence, margin, entropy, diverse")
