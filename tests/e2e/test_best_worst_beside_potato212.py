"""Best–worst scaling, from annotators answering in the real Potato 2.12.1 to a trained model's picks.

A project of 16 hotel reviews, each as good as one word says (dreadful … superb),
with a bws schema ``quality`` and ``bws_config`` (tuples of four, 16 of them,
seed 7), is annotated by three annotators **through 2.12.1's own
endpoints**: each reads the tuple on screen as 2.12.1's page hands it over
(``<script id="instance_data">``: its ``_bws_items``) and posts
``quality:best`` and ``quality:worst`` (positions, ``A`` … ``D``) to
``/updateinstance``, as its page's hidden inputs do. Then:

- the bundle's items are the tuples 2.12.1 showed, each with its four texts
  in the order shown and how many annotators picked each position as best
  and as worst (always runs);
- one training run with no trainer named (the default for a bws schema is
  ``hf-reward-model``) succeeds, its holdout scores carry the best–worst
  metrics, and every tuple gets a prediction: its best, its worst, and each
  text's score.

Cost (2 cores): about 10 s to annotate (one 2.12.1 start) and under a minute
for the run (a tiny model: this is not the learning test, which is
tests/integration/test_reward_model_tuples.py), plus the session's Prefect API.
"""

from __future__ import annotations

import json
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

WORDS = ["dreadful", "poor", "okay", "good", "superb"]
N_REVIEWS, N_TUPLES, N_ANSWERED = 16, 16, 12
_INSTANCE_DATA = re.compile(r'<script id="instance_data" type="application/json">(.*?)</script>', re.S)


def _review(i: int) -> dict:
    return {"id": f"r{i:02d}", "text": f"Review {i}: the room was {WORDS[(i * 3) % 5]} and the staff {WORDS[i % 5]}."}


def _quality(text: str) -> int:
    """How good a review is: the sum of its two words' places on the scale."""
    return sum(WORDS.index(word) for word in re.findall("|".join(WORDS), text))


def _project(root: Path, model: Path) -> Path:
    with open(root / "reviews.jsonl", "w", encoding="utf-8") as f:
        for i in range(N_REVIEWS):
            f.write(json.dumps(_review(i)) + "\n")
    config = {
        "annotation_task_name": "Hotel reviews",
        "task_dir": ".",
        "data_files": ["reviews.jsonl"],
        "item_properties": {"id_key": "id", "text_key": "text"},
        "output_annotation_dir": "annotations",
        "admin_api_key": "reviews-admin",
        "user_config": {"allow_all_users": True},
        "require_password": False,
        "bws_config": {"tuple_size": 4, "num_tuples": N_TUPLES, "seed": 7},
        "annotation_schemes": [{"annotation_type": "bws", "name": "quality",
                                "description": "Which review is the most positive, which the least?"}],
        "model_training": {"enabled": False, "split_seed": 3, "splits": {"train": 0.7, "val": 0.0, "test": 0.3},
                           "trainers": {"hf-reward-model": {"model": str(model), "max_length": 48, "epochs": 6,
                                                            "learning_rate": 1e-3, "batch_size": 4}},
                           "writeback": {"include_unlabeled": True}},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _answer(annotator: Annotator, who: int) -> tuple[str, list[str], str, str]:
    """Pick the tuple on screen's best and worst as its page would post them; carol picks the best she sees
    second-best in one tuple of three. Returns the tuple, its texts as shown, and the picks."""
    data = json.loads(_INSTANCE_DATA.search(annotator.page()).group(1))
    item = data["id"]
    shown = [member["text"] for member in sorted(data["_bws_items"], key=lambda m: m["position"])]
    ranked = sorted(range(4), key=lambda k: (_quality(shown[k]), -k))  # equal quality: the first shown is better
    best = ranked[-2] if who == 2 and int(item[-4:]) % 3 == 0 else ranked[-1]
    picks = "ABCD"[best], "ABCD"[ranked[0]]
    answer = json.loads(annotator._post_json("/updateinstance", {
        "instance_id": item, "annotations": {"quality:best": picks[0], "quality:worst": picks[1]},
        "client_timestamp": "2026-01-01T00:00:00Z"}))
    assert answer.get("status") == "success", answer
    annotator.next()
    return item, shown, picks[0], picks[1]


@pytest.fixture(scope="module")
def annotated(potato212, tmp_path_factory):
    """The project, annotated by three annotators through 2.12.1 (2.12.1 left stopped), and what each saw."""
    root = tmp_path_factory.mktemp("reviews")
    config = _project(root, build_tiny_model(root / "tiny-model", [_review(i)["text"] for i in range(N_REVIEWS)]))
    server = Potato212Server(potato212, config, root / "potato212.log").start()
    answers: dict[str, list[tuple[str, list[str], str, str]]] = {}
    try:
        for who, name in enumerate(("alice", "bob", "carol")):
            annotator = Annotator(server, name)
            answers[name] = [_answer(annotator, who) for _ in range(N_ANSWERED)]
    finally:
        server.stop()
    return config, answers


def test_the_bundle_holds_the_tuples_potato_212_showed_and_each_annotators_picks(annotated, tmp_path):
    config_path, answers = annotated
    build_bundle(load_config(config_path), ["quality"], tmp_path / "bundle", holdout_fraction=0.0)
    items = {item["id"]: item for item in map(json.loads, (tmp_path / "bundle" / "items.jsonl").read_text(
        "utf-8").splitlines())}
    assert sorted(items) == [f"bws_tuple_{i:04d}" for i in range(1, N_TUPLES + 1)]
    expected: dict[str, dict] = {}
    for picks in answers.values():
        for item, shown, best, worst in picks:
            assert items[item]["sides"] == {"quality": shown}, item
            counts = expected.setdefault(item, {"best": {}, "worst": {}})
            counts["best"][best] = counts["best"].get(best, 0) + 1
            counts["worst"][worst] = counts["worst"].get(worst, 0) + 1
    assert len(expected) == N_ANSWERED
    for item, counts in expected.items():
        assert items[item]["labels"] == {"quality": counts}, item
    assert all(items[item]["labels"] == {} for item in set(items) - set(expected))


def test_one_run_trains_the_bws_schema_and_predicts_every_tuple(annotated, prefect_api):
    config_path, _ = annotated
    done = potato("training", "run", str(config_path), "--schema", "quality", timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = int(re.search(r"Run (\d+) queued: hf-reward-model on quality", done.stdout).group(1))
    config = load_config(config_path)
    run = open_store(config).get_run(run_id)
    assert run.state == "succeeded", run
    scores = run.scores["quality"]
    assert scores["kind"] == "best_worst" and scores["n"] > 0, scores
    assert {"agreement", "best_agreement", "worst_agreement", "annotator_agreement", "decided"} <= set(scores)
    predictions = {p["id"]: p for p in map(json.loads, run_paths(config, run_id).predictions.read_text(
        "utf-8").splitlines())}
    assert sorted(predictions) == [f"bws_tuple_{i:04d}" for i in range(1, N_TUPLES + 1)]
    for line in predictions.values():
        rewards = line["rewards"]
        assert len(rewards) == 4 and line["label"] == "ABCD"[rewards.index(max(rewards))]
        assert line["worst"] == "ABCD"[rewards.index(min(rewards))] and line["worst"] != line["label"]
    run_log = run_paths(config, run_id).run_log.read_text("utf-8")
    assert "the best and the worst of tuples of 4 (A, B, C, D)" in run_log
    assert processes_matching(str(config_path.parent)) == []
