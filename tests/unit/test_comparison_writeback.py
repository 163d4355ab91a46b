"""Pairwise and ranking predictions under model_review: written as the model's confidence only, so that
Potato 2.12 serves the comparisons it is least sure of first and pre-fills nothing.

The writeback is the real one, on a real config, bundle and data file; 2.12.1's own order is applied as in
tests/unit/test_review_order.py, and tests/e2e/test_comparisons_beside_potato212.py asks the real 2.12.1
(and looks at its page in a browser).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import yaml

from potato.config import load_config
from potato.prefill.review_order import ORDER_KEY, strip_order
from potato.results.cold_start_writeback import cold_start_schemas, needs_cold_start
from potato.results.writeback import write_back
from tests.support.live_project import succeeded_run
from tests.support.potato_project import write_user_state
from tests.unit.test_review_order import _file, served_by_potato_212

REPLIES = ["Reply 1", "Reply 2", "Reply 3"]


def _config(tmp_path: Path, schemas=("pref", "rank"), **writeback) -> Path:
    items = [{"id": f"q{n}", "text": f"question {n}", "replies": [f"yes {n}", f"no {n}"],
              **{reply: f"{reply} to {n}" for reply in REPLIES}} for n in range(6)]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    raw = {
        "annotation_task_name": "Replies", "task_dir": ".", "data_files": ["items.jsonl"], "admin_api_key": "k",
        "output_annotation_dir": "annotations", "item_properties": {"id_key": "id", "text_key": "text"},
        "assignment_strategy": "model_review",
        "annotation_schemes": [
            {"annotation_type": "pairwise", "name": "pref", "description": "Which?", "items_key": "replies"},
            {"annotation_type": "ranking", "name": "rank", "description": "Order them", "labels": REPLIES},
            {"annotation_type": "radio", "name": "topic", "labels": ["food", "travel"]}],
        "model_training": {"holdout_fraction": 0.0,
                           "writeback": {"schemas": list(schemas), "include_unlabeled": True, **writeback}},
    }
    write_user_state(tmp_path / "annotations", "alice", {"q0": {"topic": "food"}})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _pref(item: str, b: float) -> dict:
    side, confidence = ("B", b) if b >= 0.5 else ("A", 1 - b)
    return {"id": item, "schema": "pref", "label": side, "confidence": confidence, "probs": [1 - b, b]}


def _rank(item: str, probs: list[float]) -> dict:
    order = [REPLIES[k] for k in sorted(range(3), key=lambda k: -probs[k])]
    return {"id": item, "schema": "rank", "order": order, "label": order[0], "confidence": max(probs),
            "probs": probs}


# pref's margin number: 1 - |a - b|; rank's: 1 - (first - second). Each item's: the larger of its two.
ROWS = [_pref("q1", 0.52), _rank("q1", [0.9, 0.05, 0.05]),   # 0.96: the least sure
        _pref("q2", 0.95), _rank("q2", [0.4, 0.35, 0.25]),   # 0.95
        _pref("q3", 0.1), _rank("q3", [0.1, 0.8, 0.1]),      # 0.30
        _pref("q4", 0.99), _rank("q4", [0.05, 0.05, 0.9]),   # 0.15: the surest
        _pref("q5", 0.3)]                                    # 0.60, no ranking
SERVED = ["q1", "q2", "q5", "q3", "q4"]


def _written(tmp_path: Path, **writeback):
    config = load_config(_config(tmp_path, **writeback))
    _, predictions, bundle = succeeded_run(tmp_path, config, 1, ("pref", "rank"), ROWS)
    return config, write_back(config, 1, ["pref", "rank"], predictions, bundle)


def test_each_comparison_is_written_as_its_confidence_only_and_served_least_sure_first(tmp_path):
    config, summary = _written(tmp_path, min_confidence=0.9)
    records = _file(config)
    assert served_by_potato_212(records) == SERVED
    for row in ROWS:  # the model's own probability, no answer: 2.12 pre-fills nothing from it
        payload = records[row["id"]][row["schema"]]
        assert strip_order(payload) == {"confidence": row["confidence"]}, (row, payload)
    assert {records[i]["pref"][ORDER_KEY]["by"] for i in SERVED} == {"margin"}
    # min_confidence is a pre-fill's threshold: nothing of a comparison is held back by it.
    assert summary.describe().startswith(
        f"Wrote back to {summary.path}: pref: 5 predictions as their confidence only (Potato 2.12 pre-fills no "
        "comparison; model_review orders by it); rank: 4 predictions as their confidence only (Potato 2.12 "
        "pre-fills no comparison; model_review orders by it); model_review order: margin, 5 items ranked")
    assert (summary.items_confidence_only, summary.items_prefilled) == (5, 0)
    first = summary.as_dict()["least_certain"][0]
    assert (first["id"], first["predictions"]) == ("q1", {
        "pref": "confidence 0.52 (orders the item; pre-fills nothing)",
        "rank": "confidence 0.90 (orders the item; pre-fills nothing)"})


def test_under_least_confidence_potato_212_orders_them_by_the_confidences_alone(tmp_path):
    config, _ = _written(tmp_path, order="least-confidence")
    records = _file(config)
    assert all(ORDER_KEY not in payload for preds in records.values() for payload in preds.values())
    # each item's lowest confidence: q1 0.52, q2 0.4, q3 0.8, q4 0.9, q5 0.7
    assert served_by_potato_212(records) == ["q2", "q1", "q5", "q3", "q4"]


def test_a_cold_start_orders_the_schemas_it_can_and_is_not_queued_for_comparisons_alone(tmp_path):
    def live(config):
        return replace(config, model_training=replace(
            config.model_training, writeback=replace(config.model_training.writeback, live=True)))

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    comparisons_only = live(load_config(_config(tmp_path / "a")))
    assert (cold_start_schemas(comparisons_only), needs_cold_start(comparisons_only)) == ([], False)
    beside_a_radio = live(load_config(_config(tmp_path / "b", ("pref", "topic", "rank"))))
    assert (cold_start_schemas(beside_a_radio), needs_cold_start(beside_a_radio)) == (["topic"], True)


def test_a_worker_s_bad_comparison_lines_are_named_and_the_good_ones_still_order_the_items(tmp_path):
    bad = [{**_pref("q1", 0.52), "confidence": 1.5}, {**_pref("q2", 0.95), "confidence": float("nan")},
           {key: v for key, v in _pref("q3", 0.1).items() if key != "confidence"},
           {**_pref("q5", 0.3), "label": "C"}, {**_rank("q4", [0.05, 0.05, 0.9]), "order": ["Reply 1", "Reply 9"]},
           {**_pref("q4", 0.99), "id": "q" * 2_000_000}, {**_pref("q4", 0.99), "id": "q\ud800"}]
    config = load_config(_config(tmp_path))
    good = [_pref("q4", 0.99), _rank("q3", [0.1, 0.8, 0.1])]
    _, predictions, bundle = succeeded_run(tmp_path, config, 1, ("pref", "rank"), [])
    predictions.write_text("".join(json.dumps(row) + "\n" for row in bad + good))
    summary = write_back(config, 1, ["pref", "rank"], predictions, bundle)
    assert summary.bad_lines == 5, summary.bad_examples
    assert summary.held_back == {"pref": {"not_an_item": 2}}
    assert summary.bad_examples[0] == "line 1: confidence is 1.5; use a number from 0 to 1"
    records = _file(config)
    assert {i: {s: strip_order(p) for s, p in preds.items()} for i, preds in records.items()} == {
        "q3": {"rank": {"confidence": 0.8}}, "q4": {"pref": {"confidence": 0.99}}}
    assert served_by_potato_212(records) == ["q3", "q4"]
