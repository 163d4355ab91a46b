"""The order Potato 2.12 serves items in under model_review: each strategy's numbers, and the places the
writeback carries them in without changing a confidence.

The writeback is the real one, on a real config, bundle and data file; Potato
2.12.1's own order is applied as its ``model_review.review_order`` does (the
lowest of the first ``confidence``/``score``/``probability``/``prob`` of each
mapping at any depth, ties by id; payloads with no number after) — the
end-to-end test (tests/e2e/test_review_order_beside_potato212.py) asks the
real 2.12.1.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from potato.config import load_config
from potato.prefill.review_order import ORDER_KEY, model_confidences
from potato.prefill.writeback_shapes import payload_confidences
from potato.results.retract import retract
from potato.results.writeback import write_back, writeback_path
from potato.training.trainers import uncertainty as u
from potato.validate import validate_config_file
from tests.support.live_project import succeeded_run
from tests.support.potato_project import write_user_state

TOPICS = ["food", "travel", "price"]


def _config(tmp_path: Path, order: str | None = None, strategy: str | None = "model_review", **extra) -> Path:
    items = [{"id": f"i{n}", "text": f"item number {n}"} for n in range(10)]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    writeback = {"schemas": ["topic", "tags", "score"], "include_unlabeled": True, **extra}
    if order is not None:
        writeback["order"] = order
    raw = {
        "annotation_task_name": "Order", "task_dir": ".", "data_files": ["items.jsonl"], "admin_api_key": "k",
        "output_annotation_dir": "annotations", "item_properties": {"id_key": "id", "text_key": "text"},
        "annotation_schemes": [
            {"annotation_type": "radio", "name": "topic", "labels": TOPICS},
            {"annotation_type": "multiselect", "name": "tags", "labels": ["a", "b"]},
            {"annotation_type": "slider", "name": "score", "min_value": 0, "max_value": 10, "step": 1}],
        "model_training": {"holdout_fraction": 0.0, "writeback": writeback},
    }
    if strategy:
        raw["assignment_strategy"] = strategy
    write_user_state(tmp_path / "annotations", "alice", {"i0": {"topic": "food"}})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _write(tmp_path: Path, config_path: Path, rows: list[dict], run_id: int = 1,
           schemas=("topic", "tags", "score")):
    config = load_config(config_path)
    store, predictions, bundle = succeeded_run(tmp_path, config, run_id, schemas, rows)
    return config, store, write_back(config, run_id, list(schemas), predictions, bundle)


def _file(config) -> dict[str, dict]:
    lines = writeback_path(config).read_text(encoding="utf-8").splitlines()
    return {r["id"]: r["predictions"] for r in map(json.loads, lines)}


def served_by_potato_212(records: dict[str, dict]) -> list[str]:
    """Potato 2.12.1's model_review order over these records (its model_review.review_order, restated)."""
    keyed = {i: min((c for p in preds.values() for c in payload_confidences(p)), default=None)
             for i, preds in records.items()}
    with_number = sorted((k, i) for i, k in keyed.items() if k is not None)
    return [i for _, i in with_number] + sorted(i for i, k in keyed.items() if k is None)


def _topic(item: str, probs: list[float]) -> dict:
    best = max(range(3), key=probs.__getitem__)
    return {"id": item, "schema": "topic", "label": TOPICS[best], "confidence": probs[best], "probs": probs}


# Three items where the strategies disagree: i1 is the least confident, i2 has the smallest margin,
# i3 the highest entropy.
DISAGREE = {"i1": [0.40, 0.32, 0.28], "i2": [0.46, 0.45, 0.09], "i3": [0.42, 0.30, 0.28], "i4": [0.9, 0.05, 0.05]}


def test_each_strategy_number_is_its_formula():
    probs = [0.46, 0.45, 0.09]
    assert u.of_probs(u.MARGIN, probs) == pytest.approx(0.99)
    assert u.of_probs(u.LEAST_CONFIDENCE, probs) == pytest.approx((1 - 0.46) / (2 / 3))
    entropy = -sum(p * math.log(p) for p in probs) / math.log(3)
    assert u.of_probs(u.ENTROPY, probs) == pytest.approx(entropy)
    # Without probs, the confidence bounds them: margin >= 2c - 1, entropy <= the rest spread evenly.
    assert u.of_confidence(u.MARGIN, 0.7, 3) == pytest.approx(0.6)
    assert u.of_confidence(u.ENTROPY, 1 / 3, 3) == pytest.approx(1.0)
    # A multi-label prediction: margin is its least certain label's; entropy the labels' mean.
    assert u.schema_uncertainty(u.MARGIN, "multilabel", 0.8, [0.9, 0.55], 2) == pytest.approx(0.9)
    assert u.schema_uncertainty(u.ENTROPY, "multilabel", 0.8, [0.5, 1.0], 2) == pytest.approx(0.5)
    assert u.schema_uncertainty(u.LEAST_CONFIDENCE, "multilabel", 0.8, [0.9, 0.2], 2) == pytest.approx(0.4)
    # Spans: the least confident span, as a yes/no decision; a regression says nothing.
    spans = [{"start": 0, "end": 1, "label": "X", "confidence": 0.9}, {"start": 2, "end": 3, "label": "X",
                                                                      "confidence": 0.6}]
    assert u.schema_uncertainty(u.MARGIN, "span", None, None, 1, spans) == pytest.approx(0.8)
    assert u.schema_uncertainty(u.MARGIN, "continuous", None, None, 0) is None
    # The diverse strategy picks its candidates by margin.
    assert u.schema_uncertainty(u.DIVERSE, "nominal", 0.46, probs, 3) == u.of_probs(u.MARGIN, probs)


@pytest.mark.parametrize("order, served", [
    ("margin", ["i2", "i1", "i3", "i4"]),
    ("entropy", ["i1", "i3", "i2", "i4"]),
    ("least-confidence", ["i1", "i3", "i2", "i4"]),
])
def test_potato_212_serves_each_strategys_order_and_every_confidence_stays_the_models(tmp_path, order, served):
    config, _, summary = _write(tmp_path, _config(tmp_path, order), [_topic(i, p) for i, p in DISAGREE.items()])
    records = _file(config)
    assert served_by_potato_212(records) == served
    for item, probs in DISAGREE.items():
        payload = records[item]["topic"]
        assert payload["confidence"] == max(probs) and payload["label"] == TOPICS[probs.index(max(probs))]
        assert model_confidences(payload) == [max(probs)]
    if order == "least-confidence":  # 2.12's own order: nothing is added
        assert all(ORDER_KEY not in records[i]["topic"] for i in records)
        assert summary.describe().endswith("; model_review order: least-confidence (2.12's own: lowest confidence "
                                           "first)")
    else:
        places = {i: records[i]["topic"][ORDER_KEY] for i in records}
        assert [places[i]["rank"] for i in served] == [1, 2, 3, 4]
        assert {p["by"] for p in places.values()} == {order}
        assert all(places[i]["score"] <= records[i]["topic"]["confidence"] for i in records)
        assert summary.describe().endswith(f"; model_review order: {order}, 4 items ranked")


def test_margin_is_the_default_and_without_model_review_nothing_is_added(tmp_path):
    config, _, _ = _write(tmp_path, _config(tmp_path), [_topic(i, p) for i, p in DISAGREE.items()])
    assert served_by_potato_212(_file(config))[0] == "i2"
    (tmp_path / "annotations" / "training").rename(tmp_path / "old-training")
    config, _, summary = _write(tmp_path, _config(tmp_path, strategy=None), [_topic(i, p) for i, p in DISAGREE.items()])
    assert all(ORDER_KEY not in preds["topic"] for preds in _file(config).values())
    assert "model_review order" not in summary.describe()


def test_every_schema_of_an_item_counts_and_a_place_goes_where_there_is_room(tmp_path):
    rows = [
        _topic("i1", [0.9, 0.05, 0.05]),  # sure of its topic, unsure of a tag: the tag decides
        {"id": "i1", "schema": "tags", "label": ["a"], "confidence": 0.55, "probs": [0.55, 0.2]},
        _topic("i2", [0.6, 0.3, 0.1]),
        {"id": "i3", "schema": "tags", "label": ["a", "b"], "confidence": 0.99, "probs": [0.99, 0.995]},
        {"id": "i4", "schema": "score", "value": 7},  # a slider alone: no number, no room but a payload of its own
        {"id": "i5", "schema": "tags", "label": [], "confidence": 0.51, "probs": [0.49, 0.3]},  # the empty set
    ]
    config, _, summary = _write(tmp_path, _config(tmp_path, "margin"), rows)
    records = _file(config)
    assert served_by_potato_212(records) == ["i5", "i1", "i2", "i3", "i4"]
    # The empty set pre-fills nothing, but holds its place (in the first schema that pre-fills nothing from a
    # mapping) so that it is served: ranks are 1 of 4 ... 4 of 4, scores at most the lowest confidence after.
    assert records["i5"] == {"topic": {ORDER_KEY: {"by": "margin", "rank": 1, "score": pytest.approx(0.11)},
                                       "run_id": 1}}
    assert records["i1"]["topic"][ORDER_KEY] == {"by": "margin", "rank": 2, "score": pytest.approx(0.22)}
    assert ORDER_KEY not in records["i1"]["tags"][0]
    assert records["i3"]["tags"][0][ORDER_KEY]["rank"] == 4  # a list's first entry holds it
    assert records["i4"] == {"score": 7}  # a slider alone says nothing to rank it by: after the others, by id
    assert summary.items_order_only == 1 and summary.ranked == 4
    first = summary.as_dict()["least_certain"][:2]
    assert [(e["id"], e["confidence"]) for e in first] == [("i5", None), ("i1", 0.55)]
    assert first[0]["predictions"] == {"topic": "nothing pre-filled (its place in the order only)"}


def test_order_lines_go_first_then_the_rest_by_number(tmp_path):
    rows = [_topic(i, p) for i, p in DISAGREE.items()]
    rows += [{"id": "i4", "schema": "topic", "order_rank": 0}, {"id": "i3", "schema": "topic", "order_rank": 1},
             {"id": "i0", "schema": "topic", "order_rank": 2}]  # i0 was trained on: its rank is held back too
    config, _, _ = _write(tmp_path, _config(tmp_path, "diverse"), rows)
    records = _file(config)
    assert served_by_potato_212(records) == ["i4", "i3", "i2", "i1"]
    assert "i0" not in records and {records[i]["topic"][ORDER_KEY]["by"] for i in records} == {"diverse"}


def test_a_run_of_order_lines_only_places_items_that_prefill_nothing(tmp_path):
    rows = [{"id": f"i{n}", "schema": s, "order_rank": r} for r, n in enumerate([5, 2, 9, 1])
            for s in ("topic", "score")]
    config, _, summary = _write(tmp_path, _config(tmp_path, "least-confidence"), rows)
    records = _file(config)
    assert served_by_potato_212(records) == ["i5", "i2", "i9", "i1"]
    assert records["i5"] == {"topic": {ORDER_KEY: {"by": "cold-start", "rank": 1, "score": 0.2}, "run_id": 1}}
    assert summary.items_order_only == 4 and summary.items_prefilled == 0
    assert summary.describe().endswith("; model_review order: cold-start, 4 items ranked")


def test_a_newer_writeback_and_a_retract_take_every_earlier_place_away(tmp_path):
    config_path = _config(tmp_path, "margin")
    _write(tmp_path, config_path, [_topic(i, p) for i, p in DISAGREE.items()], schemas=("topic",))
    # Run 2 writes the tags only: the topic payloads of run 1 stay, without run 1's places.
    config, store, _ = _write(tmp_path, config_path, [
        {"id": "i4", "schema": "tags", "label": ["b"], "confidence": 0.6, "probs": [0.1, 0.6]}], 2, ("tags",))
    records = _file(config)
    assert ORDER_KEY not in records["i1"]["topic"] and records["i4"]["tags"][0][ORDER_KEY]["rank"] == 1
    assert served_by_potato_212(records)[0] == "i4"
    retract(config, store, 2)
    assert all(ORDER_KEY not in json.dumps(p) for p in _file(config).values())


def test_an_unknown_order_is_refused_with_the_closest_name(tmp_path):
    report = validate_config_file(_config(tmp_path, "marign"))
    assert [(e.path, e.message) for e in report.errors] == [(
        "model_training.writeback.order",
        "model_training.writeback.order is 'marign', not an order; did you mean `margin`? Orders: "
        "least-confidence, margin, entropy, diverse")]
    report = validate_config_file(_config(tmp_path, "random"))
    assert report.errors[0].message == ("model_training.writeback.order is 'random', not an order. Orders: "
                                        "least-confidence, margin, entropy, diverse")


def test_an_order_line_is_checked_where_it_enters(tmp_path):
    from potato.prefill.prediction_shapes import check_answer_fields

    check_answer_fields({"id": "i1", "schema": "topic", "order_rank": 3})
    with pytest.raises(ValueError, match=r"order_rank is -1; use a whole number from 0 \(the first item to serve\)"):
        check_answer_fields({"id": "i1", "schema": "topic", "order_rank": -1})
    config, _, summary = _write(tmp_path, _config(tmp_path), [{"id": "i1", "schema": "topic", "order_rank": 1.5}])
    assert summary.bad_examples == ["line 1: order_rank is 1.5; use a whole number from 0 (the first item to serve)"]


def test_an_agent_refuses_a_claim_whose_order_it_does_not_know():
    from potato.training.claims import BadClaim, check_claim
    from tests.support.claims import make_claim

    claim = make_claim()
    claim["job"]["order"] = {"strategy": "margin", "batch": 25}
    assert check_claim(claim) is claim
    claim["job"]["order"] = {"strategy": "margin", "batch": 0}
    with pytest.raises(BadClaim, match=r"^job\.order\.batch is '0'; expected a whole number from 1 to 10000$"):
        check_claim(claim)
