"""Ranking answers: read as Potato 2.12.1 stores them, what each label stands for, the bundle, pairs and holdout.

2.12.1's ranking widget stores the labels in the annotator's order, best
first, joined by commas, under ``rank_order``:
``[{"schema": S, "name": "rank_order"}, "Response B,Response A,Response C"]``;
an untouched widget stores an empty order.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from potato.annotations.aggregation import ranking_orders
from potato.annotations.annotator_answers import read_answers, split_order
from potato.bundle.build import build_bundle, describe_bundle
from potato.config import Scheme
from potato.items.ranking_texts import FIELDS, LABELS, LINES, ranking_texts
from potato.prefill.prediction_shapes import parse_prediction
from potato.training.answer_kinds import RANKING, borda_order
from potato.training.trainers.answers import SchemaAnswers
from potato.training.trainers.hf_reward_model import label_order_baseline, order_pairs, order_prediction
from potato.training.trainers.metrics import describe, holdout_scores
from tests.support.answer_project import pair, write_state
from tests.support.potato_project import make_project, project_config
from tests.unit.test_config import build, seed_dict

LABELS_ = ("Response A", "Response B", "Response C")
QUALITY = Scheme("quality", "ranking", LABELS_)
QUESTION = "Question: How do I reverse a list?\n\n"
ITEMS = [
    {"id": "q1", "text": QUESTION + "Response A: Use list[::-1].\nResponse B: Loop backwards.\n"
                                    "Response C: Python cannot do it."},
    {"id": "q2", "text": "Which is kinder?", "Response A": "Thank you!", "Response B": "Whatever.",
     "Response C": "Go away."},
    {"id": "q3", "text": "A review that says nothing of the responses."},
]


def test_a_ranking_schema_in_the_config(tmp_path):
    raw = seed_dict()
    raw["annotation_schemes"].append({"annotation_type": "ranking", "name": "quality", "description": "Rank them",
                                      "labels": list(LABELS_), "allow_ties": True})
    scheme = build(tmp_path, raw).config.scheme("quality")
    assert (scheme.kind, scheme.labels) == (RANKING, LABELS_)
    raw["annotation_schemes"][-1]["labels"] = ["only one"]
    assert [e.message for e in build(tmp_path, raw).errors] == [
        "annotation_schemes[1].labels (scheme 'quality') lists 1 label(s); a ranking orders its labels, so list at "
        "least two (the responses or options annotators put in order)"]
    raw["annotation_schemes"][-1]["labels"] = list(LABELS_)
    raw["model_training"]["writeback"]["schemas"] = ["sentiment", "quality"]
    assert [e.message for e in build(tmp_path, raw).errors] == [
        "model_training.writeback.schemas[1] is 'quality', a ranking schema: Potato 2.12 pre-fills nothing for one, "
        "so writing it back only orders the items, and only under assignment_strategy: model_review (the "
        "comparisons the model is least sure of first); set assignment_strategy: model_review, or remove it from "
        "writeback.schemas (its predictions stay in the run's predictions.jsonl and on its run page)"]
    raw["assignment_strategy"] = {"name": "model_review"}
    assert build(tmp_path, raw).errors == ()


@pytest.mark.parametrize("value, order", [
    ("Response B,Response A,Response C", ("Response B", "Response A", "Response C")),
    (" Response C , Response A,Response B ", ("Response C", "Response A", "Response B")),
    (["Response A", "Response C", "Response B"], ("Response A", "Response C", "Response B")),
    ("Response B,Response A", None),                         # a label left out
    ("Response B,Response B,Response A", None),              # one twice
    ("Response B,Response A,Response C,", None),             # an empty place
    ("Response B,Response A,Response D", None),              # not a label
    (3, None),
])
def test_a_stored_order_is_split_on_the_labels(value, order):
    assert split_order(value, sorted(LABELS_, key=len, reverse=True)) == order


def test_a_label_holding_a_comma_stays_whole():
    labels = sorted(["fast, cheap", "fast", "cheap"], key=len, reverse=True)
    assert split_order("fast,fast, cheap,cheap", labels) == ("fast", "fast, cheap", "cheap")


def _project(tmp_path):
    make_project(tmp_path, n_items=0)
    config = project_config(tmp_path / "config.yaml")
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in ITEMS), encoding="utf-8")
    config = replace(config, schemes=(QUALITY,), data_files=(data,))
    out = config.output_annotation_dir
    write_state(out, "alice", {
        "q1": [pair("quality", "rank_order", "Response A,Response B,Response C")],
        "q2": [pair("quality", "rank_order", "Response A,Response C")],
        "q3": [pair("quality", "rank_order", "")],
    })
    write_state(out, "bob", {"q1": [pair("quality", "rank_order", "Response B,Response A,Response C")],
                             "q2": [pair("quality", "rank_order", "Response A,Response B,Response C")]})
    return config


def test_each_order_is_read_and_what_is_not_one_is_named(tmp_path):
    config = _project(tmp_path)
    out = config.output_annotation_dir
    answers = read_answers(out, (QUALITY,), base=out)
    assert answers.orders == {"quality": {
        "q1": [("Response A", "Response B", "Response C"), ("Response B", "Response A", "Response C")],
        "q2": [("Response A", "Response B", "Response C")]}}
    assert answers.warnings == [
        "alice/user_state.json: item(s) 'q2' have 'Response A,Response C' for schema 'quality', which is not an "
        "order of all its labels, each once; those answers were skipped"]


def test_what_each_label_stands_for():
    by_lines = ranking_texts(ITEMS[0], ITEMS[0]["text"], LABELS_)
    assert by_lines == (QUESTION.strip(), ["Use list[::-1].", "Loop backwards.", "Python cannot do it."], LINES)
    assert ranking_texts(ITEMS[1], ITEMS[1]["text"], LABELS_) == (
        "Which is kinder?", ["Thank you!", "Whatever.", "Go away."], FIELDS)
    assert ranking_texts(ITEMS[2], ITEMS[2]["text"], LABELS_) == (ITEMS[2]["text"], list(LABELS_), LABELS)
    # Lines in another order than the labels': each label keeps its own text.
    swapped = "Response B: second\nResponse A: first\nResponse C: third"
    assert ranking_texts({}, swapped, LABELS_).texts == ["first", "second", "third"]


def test_orders_are_aggregated_by_the_borda_count():
    orders = [("b", "a", "c"), ("a", "b", "c"), ("b", "c", "a")]
    assert borda_order(orders, ["a", "b", "c"]) == (["b", "a", "c"], "b")
    assert borda_order(orders[:2], ["a", "b", "c"]) == (["a", "b", "c"], "tie")
    coded, ties = ranking_orders({"q1": orders[:2], "q2": orders}, ["a", "b", "c"])
    assert coded.decode(coded.per_item["q1"]) == [["a", "b", "c"], ["b", "a", "c"]]
    assert ties == 1


def test_the_bundle_holds_each_labels_text_the_prompt_and_the_orders(tmp_path):
    config = _project(tmp_path)
    info = build_bundle(config, ["quality"], tmp_path / "bundle", holdout_fraction=0.0)
    written = (tmp_path / "bundle" / "items.jsonl").read_text().splitlines()
    lines = {line["id"]: line for line in map(json.loads, written)}
    assert lines["q1"]["sides"] == {"quality": ["Use list[::-1].", "Loop backwards.", "Python cannot do it."]}
    assert lines["q1"]["prompts"] == {"quality": QUESTION.strip()}
    assert lines["q1"]["labels"] == {"quality": [list(LABELS_), ["Response B", "Response A", "Response C"]]}
    assert "prompts" not in lines["q2"] and lines["q3"]["sides"] == {"quality": list(LABELS_)}
    assert "quality: 2 labelled (Response A 1, Response B 0, Response C 0, tie 1; 0 held out, 1 ties)" in \
        describe_bundle(info)
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["answers"]["quality"] == {"type": "ranking", "kind": "ranking", "size": 3}


def test_gold_orders_and_the_pairs_they_imply():
    answers = SchemaAnswers("quality", ["a", "b", "c"], {"kind": "ranking"})
    assert answers.describe() == "orders of 3 (a, b, c)"
    gold = answers.gold([["b", "a", "c"], ["a", "b", "c"]])
    assert gold == [["b", "a", "c"], ["a", "b", "c"]]
    for bad in ([["a", "b"]], [["a", "a", "b"]], [], "a,b,c", [[{"x": 1}, "b", "c"]]):
        assert answers.gold(bad) is None
    # a over c twice, b over c twice, b over a once and a over b once: six pairs.
    assert order_pairs(gold, answers.labels) == [(0, 1, 1 / 6), (0, 2, 2 / 6), (1, 0, 1 / 6), (1, 2, 2 / 6)]


def test_an_order_prediction_and_its_holdout():
    labels = ["a", "b", "c"]
    record = order_prediction("q1", "quality", (0.5, 2.0, -1.0), labels)
    assert (record["label"], record["order"]) == ("b", ["b", "a", "c"]) and "worst" not in record
    assert record["probs"][1] == record["confidence"] and abs(sum(record["probs"]) - 1) < 1e-5
    kinds, names = {"quality": RANKING}, {"quality": labels}
    assert parse_prediction(record, kinds, names).answer == ["b", "a", "c"]
    with pytest.raises(ValueError, match=r"order is \['b', 'a'\], not every label of 'quality' once"):
        parse_prediction({**record, "order": ["b", "a"]}, kinds, names)
    with pytest.raises(ValueError, match="label is 'a', not the first of its order, 'b'"):
        parse_prediction({**record, "label": "a"}, kinds, names)
    gold = [[["a", "b", "c"], ["b", "a", "c"]], [["c", "b", "a"]]]
    scores = holdout_scores(gold, [["a", "b", "c"], ["b", "c", "a"]], RANKING, labels)
    # Pairs: 3 + 2 of the first item's, 2 of 3 of the second's; its Borda count puts c first, the model b.
    assert scores == {"kind": "ranking", "n": 2, "agreement": 0.7778, "kendall_tau": 0.5749, "spearman": 0.683,
                      "top_agreement": 0.0, "decided": 1}
    assert describe("quality", scores) == (
        "Holdout quality: pairwise agreement with each annotator 0.778, Kendall's tau with the Borda count 0.575, "
        "Spearman's rho 0.683, first place 0.000 (n=2)")
    # One order for every item, the training answers' Borda count (a, b, c): 5 of the 9 held-out pairs.
    assert label_order_baseline([[["a", "b", "c"]]], gold, labels) == 0.5556


def test_the_run_pages_evaluation_of_a_ranking(tmp_path):
    from potato.results.evaluation import record_evaluation

    config = _project(tmp_path)
    build_bundle(config, ["quality"], tmp_path / "bundle", holdout_fraction=0.999999)
    rows = [order_prediction("q1", "quality", (2.0, 1.0, 0.0), list(LABELS_)),   # alice's order: 3 + 2 of its pairs
            order_prediction("q2", "quality", (0.0, 1.0, 2.0), list(LABELS_))]   # the reverse of bob's: 0 of 3
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    evaluation = record_evaluation(5, tmp_path / "run", tmp_path / "bundle", ["quality"])["schemas"]["quality"]
    assert {key: evaluation[key] for key in ("kind", "n", "missing", "agreement", "top_agreement", "decided")} == {
        "kind": "ranking", "n": 2, "missing": 0, "agreement": 0.5556, "top_agreement": 0.0, "decided": 1}  # 5 of 9
    assert sum(b["n"] for b in evaluation["reliability"]) == 1  # q2's first place: q1's Borda count ties
    lines = [json.loads(line) for line in (tmp_path / "run" / "labels.jsonl").read_text().splitlines()]
    assert lines[0]["order"] == list(LABELS_) and lines[0]["gold"] == [list(LABELS_), ["Response B", "Response A",
                                                                                        "Response C"]]
