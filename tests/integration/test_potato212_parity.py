"""What this project shares with Potato 2.12.1, checked against the real one (its own venv, no server).

Its config validator, its list of ``model_training`` keys, its split and its
Dawid-Skene consensus are run in 2.12.1's interpreter and compared with ours.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections import defaultdict

import pytest
import yaml

from potato.annotations.consensus import dawid_skene, strict_majority
from potato.bundle.holdout import split_of
from potato.config import POTATO_212_KEYS
from potato.validate import validate_config_file
from tests.unit.test_config import write_project
from tests.unit.test_config_potato212 import POTATO_212_MODEL_TRAINING

pytestmark = pytest.mark.potato212


def _run_212(potato212, code: str, *args: str) -> str:
    python = potato212.with_name("python")
    done = subprocess.run([str(python), "-c", code, *args], capture_output=True, text=True, timeout=120,
                          cwd="/", stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_config_potato_212_accepts_strictly_passes_ours_without_warnings(potato212, tmp_path):
    raw = {
        "annotation_task_name": "Review Sentiment", "task_dir": ".", "data_files": ["data/reviews.json"],
        "item_properties": {"id_key": "id", "text_key": "text"}, "output_annotation_dir": "annotation_output",
        "admin_api_key": "test-admin-key", "user_config": {"allow_all_users": True}, "require_password": False,
        "annotation_schemes": [{"annotation_type": "radio", "name": "sentiment", "description": "?",
                                "labels": ["positive", "negative"]}],
        "pre_annotation": {"enabled": True, "predictions_file": "annotation_output/training/predictions.jsonl"},
        "model_training": POTATO_212_MODEL_TRAINING,
    }
    path = write_project(tmp_path, raw)
    theirs = subprocess.run([str(potato212), "validate", "--strict", str(path)], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    ours = validate_config_file(path)
    assert ours.errors == () and ours.warnings == ()


def test_our_table_lists_every_model_training_key_potato_212_knows(potato212):
    known = json.loads(_run_212(potato212, (
        "import json; from potato.server_utils.config_module import KNOWN_CONFIG_KEYS as K; "
        "mt = K['model_training']; "
        "print(json.dumps(sorted([k for k in mt] + [k + '.' + s for k, v in mt.items() if v for s in v])))")))
    ours = {k for k, _ in POTATO_212_KEYS if not k.startswith("auto_retrain.")}
    assert ours == set(known)


def test_split_of_is_potato_212s_partition(potato212):
    ids = [f"item-{i}" for i in range(1000)]
    specs = [({"train": 0.7, "val": 0.15, "test": 0.15}, 0), ({"train": 0.8, "test": 0.2}, 7),
             ({"test": 0.3, "train": 0.7}, 42)]
    theirs = json.loads(_run_212(potato212, (
        "import json, sys; from potato.publish.preprocessing import _partition_splits as p; "
        "ids, specs = json.loads(sys.argv[1]), json.loads(sys.argv[2]); "
        "print(json.dumps([{r['instance_id']: n for n, rows in p([{'instance_id': i} for i in ids], s, seed).items() "
        "for r in rows} for s, seed in specs]))"), json.dumps(ids), json.dumps(specs)))
    for (spec, seed), assigned in zip(specs, theirs):
        assert {i: split_of(i, spec, seed) for i in ids} == assigned


def test_consensus_is_potato_212s_dawid_skene_where_no_strict_majority_decides(potato212):
    """Ours differs from 2.12.1's on purpose (potato.annotations.consensus): a strict majority decides its items, and a
    prior on the confusion rows keeps close calls from going to whoever agreed most elsewhere. Where the
    model decides, both weigh annotators by reliability and mostly agree (recorded: 165 of 196 items)."""
    rng = random.Random(5)
    cases = []
    for _ in range(20):
        workers = [f"w{n}" for n in range(rng.randint(2, 5))]
        accuracy = {w: rng.uniform(0.3, 1.0) for w in workers}
        observations = []
        for item in range(rng.randint(5, 40)):
            truth = rng.randrange(3)
            for w in rng.sample(workers, rng.randint(1, len(workers))):
                label = truth if rng.random() < accuracy[w] else rng.randrange(3)
                observations.append((w, f"i{item}", label))
        cases.append(observations)
    # 2.12 takes labels as strings and orders classes by them; "0" < "1" < "2" keeps our index order.
    theirs = json.loads(_run_212(potato212, (
        "import json, sys; from potato.server_utils.consensus import dawid_skene as ds; "
        "cases = json.loads(sys.argv[1]); "
        "print(json.dumps([ds([(w, i, str(l)) for w, i, l in c]).labels for c in cases]))"), json.dumps(cases)))
    agree = total = 0
    for observations, their_labels in zip(cases, theirs):
        by_item = defaultdict(list)
        for w, i, label in observations:
            by_item[i].append((w, label))
        labels, ties = dawid_skene(by_item)
        for item, label in labels.items():
            majority = strict_majority(tuple(by_item[item]))
            if majority is not None:
                assert label == majority
            else:
                total += 1
                agree += str(label) == their_labels[item]
    assert total > 150 and agree >= 0.8 * total


def test_our_writeback_file_is_read_by_potato_212s_loader(potato212, tmp_path):
    (tmp_path / "predictions.jsonl").write_text(
        json.dumps({"id": "r1", "predictions": {"sentiment": {"label": "negative", "confidence": 0.91,
                                                              "run_id": 7}}}) + "\n"
        + json.dumps({"id": "r2", "predictions": {"sentiment": {"label": "positive", "confidence": 0.8,
                                                                "run_id": 7}}}) + "\n")
    loaded = json.loads(_run_212(potato212, (
        "import json, sys; from potato.quality_control import QualityControlManager as Q; "
        "m = Q({'pre_annotation': {'enabled': True, 'predictions_file': 'predictions.jsonl'}}, sys.argv[1]); "
        "m._load_prediction_file(); print(json.dumps(m.file_pre_annotations))"), str(tmp_path)))
    assert loaded == {"r1": {"sentiment": {"label": "negative", "confidence": 0.91, "run_id": 7}},
                      "r2": {"sentiment": {"label": "positive", "confidence": 0.8, "run_id": 7}}}


def test_the_shared_config_keeps_potato_212_from_training(potato212, tmp_path):
    """With model_training.enabled: false, 2.12 neither builds its training manager nor its writeback."""
    raw = yaml.safe_load(yaml.safe_dump({"model_training": POTATO_212_MODEL_TRAINING}))
    out = json.loads(_run_212(potato212, (
        "import json, sys; from potato.quality_control import writeback_prelabel_settings as w; "
        "c = json.loads(sys.argv[1]); print(json.dumps([w(c), bool(c['model_training'].get('enabled'))]))"),
        json.dumps(raw)))
    assert out == [None, False]
