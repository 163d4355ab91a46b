"""The real worker on a job with several trainers (job.json ``parts``): one after the other, merged.

A run that names no trainer trains each schema with its kind's default
trainer; the worker then runs one part per trainer in ``parts/<n>/`` and
merges their predictions, scores and artifacts (potato/training/parts.py).
Until other trainers are registered here, both parts are
hf-text-classification (on two radio schemas): the mechanism is the same.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.test_worker import TINY, done_of, events_of, run_worker, tiny_model  # noqa: F401
from tests.support.bundles import easy_items, write_bundle, write_job

pytestmark = pytest.mark.training

SCHEMAS = {"sentiment": ["positive", "negative"], "tone": ["positive", "negative"]}


def _two_schema_job(tmp_path, parts):
    items = easy_items(60, unlabeled=4)
    for item in items:
        if "sentiment" in item["labels"]:
            item["labels"]["tone"] = item["labels"]["sentiment"]
    job = write_job(tmp_path / "job", trainer=" + ".join(p["trainer"] for p in parts), schemas=list(SCHEMAS),
                    parts=parts)
    write_bundle(job / "bundle", items, SCHEMAS)
    return job


def test_each_part_trains_its_schemas_and_the_run_gets_their_merged_outputs(tmp_path, tiny_model):
    options = dict(TINY, epochs=4, model=tiny_model)
    job = _two_schema_job(tmp_path, [{"trainer": "hf-text-classification", "schemas": ["sentiment"], "options": options},
                                     {"trainer": "hf-text-classification", "schemas": ["tone"], "options": options}])
    result = run_worker(job)
    assert result.returncode == 0, result.stderr
    assert done_of(job)["status"] == "succeeded"
    events = events_of(job)
    messages = [e["message"] for e in events if e["type"] == "log"]
    assert "Part 1 of 2: hf-text-classification trains sentiment" in messages
    assert "Part 2 of 2: hf-text-classification trains tone" in messages
    progress = [e for e in events if e["type"] == "progress"]
    assert {(e["part"], e["parts"], e["trainer"], e["schema"]) for e in progress} == {
        (1, 2, "hf-text-classification", "sentiment"), (2, 2, "hf-text-classification", "tone")}
    metrics = [e["scores"] for e in events if e["type"] == "metrics"]
    assert list(metrics[0]) == ["sentiment"] and set(metrics[-1]) == {"sentiment", "tone"}

    scores = json.loads((job / "scores.json").read_text())
    assert set(scores) == {"sentiment", "tone"} and scores == metrics[-1]
    predictions = [json.loads(line) for line in (job / "predictions.jsonl").read_text().splitlines()]
    schemas = [p["schema"] for p in predictions]
    assert schemas == sorted(schemas, key=["sentiment", "tone"].index) and schemas.count("tone") == 64
    assert (job / "artifacts" / "sentiment" / "labels.json").is_file()
    assert (job / "artifacts" / "tone" / "labels.json").is_file()
    assert json.loads((job / "parts" / "2" / "job.json").read_text())["schemas"] == ["tone"]


def test_a_failing_part_fails_the_run_with_its_error_and_publishes_nothing(tmp_path, tiny_model):
    options = dict(TINY, epochs=1, model=tiny_model)
    job = _two_schema_job(tmp_path, [{"trainer": "hf-text-classification", "schemas": ["sentiment"], "options": options},
                                     {"trainer": "hf-text-classification", "schemas": ["tone"],
                                      "options": dict(options, epochs=0)}])
    result = run_worker(job)
    assert result.returncode == 1
    assert done_of(job) == {**done_of(job), "status": "failed",
                            "error": "Trainer options: epochs must be a positive integer, got 0"}
    assert not (job / "predictions.jsonl").exists() and not (job / "scores.json").exists()


def test_a_part_whose_trainer_is_not_here_fails_before_anything_trains(tmp_path):
    job = _two_schema_job(tmp_path, [{"trainer": "hf-text-classification", "schemas": ["sentiment"]},
                                     {"trainer": "hf-span-tagger", "schemas": ["tone"]}])
    result = run_worker(job)
    assert result.returncode == 1
    assert done_of(job)["error"].startswith("Unknown trainer 'hf-span-tagger'; known trainers: ")
    assert not [e for e in events_of(job) if e["type"] == "started"]
    job = _two_schema_job(tmp_path / "bad", [{"trainer": "hf-text-classification", "schemas": []},
                                             {"trainer": "hf-text-classification", "schemas": ["tone"]}])
    assert run_worker(job).returncode == 1
    assert done_of(job)["error"] == "Job: parts[0].schemas is []; expected a list of schema names"
