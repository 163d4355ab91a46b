"""Every kind's predictions: checked where they enter, written back in the shape Potato 2.12.1 pre-fills, evaluated.

The shapes are the ones a running 2.12.1 pre-fills (checked in a browser):
a list of ``{"label", "confidence"}`` for a multiselect, the label name for a
likert with labels, a bare number on the slider's step, a bare string for a
text box, spans on the text 2.12 renders.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from potato.bundle.build import build_bundle
from potato.config import WritebackConfig
from potato.items.rendered_text import render
from potato.prefill.prediction_shapes import check_answer_fields, parse_prediction
from potato.results.evaluation import record_evaluation
from potato.results.writeback import write_back, writeback_path
from tests.support.answer_project import ALL, TEXTS, bundle_project

NAMES = [s.name for s in ALL]
KINDS = {s.name: s.kind for s in ALL}
LABELS = {s.name: list(s.labels) for s in ALL}


def _predictions(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _every_kind(item: str, **extra) -> list[dict]:
    """One prediction per schema for *item*; *extra* replaces a schema's record."""
    text = TEXTS[item]
    zurich = text.index("Zürich") if "Zürich" in text else 0
    rows = {
        "sentiment": {"label": "negative", "confidence": 0.8},
        "topics": {"label": ["travel", "food"], "confidence": 0.7, "probs": [0.91, 0.72, 0.1]},
        "quality": {"label": "good", "confidence": 0.6},
        "agree": {"label": "2", "confidence": 0.6},
        "score": {"value": 41.7},
        "entities": {"spans": [{"start": zurich, "end": zurich + 6, "label": "LOC", "confidence": 0.95},
                               {"start": 0, "end": 2, "label": "PER", "confidence": 0.2}]},
        "summary": {"text": "A short summary with \u0000 and \ud83d inside."},
    }
    rows.update(extra)
    return [{"id": item, "schema": schema, **record} for schema, record in rows.items()]


def _project(tmp_path: Path, **writeback):
    config = bundle_project(tmp_path)
    wb = WritebackConfig(**{"schemas": tuple(NAMES), "include_unlabeled": True, "min_confidence": 0.5, **writeback})
    config = replace(config, model_training=replace(config.model_training, writeback=wb))
    build_bundle(config, NAMES, tmp_path / "bundle", holdout_fraction=0.0)
    return config


def test_each_kind_is_written_back_in_the_shape_potato_212_prefills(tmp_path):
    config = _project(tmp_path)
    # i0 was trained on (holdout 0) for every schema but sentiment and quality, which nobody answered there:
    # the leak guard holds back those five, the other two are written as for an unlabelled item.
    rows = _every_kind("i3") + _every_kind("i0")
    summary = write_back(config, 7, NAMES, _predictions(tmp_path / "p.jsonl", rows), tmp_path / "bundle")
    records = {r["id"]: r for r in map(json.loads, writeback_path(config).read_text("utf-8").splitlines())}
    assert list(records) == ["i0", "i3"] and set(records["i0"]["predictions"]) == {"sentiment", "quality"}
    shown = render(TEXTS["i3"]).text  # "Café Zoë met Ann in Zürich 😀"
    assert records["i3"]["predictions"] == {
        "sentiment": {"label": "negative", "confidence": 0.8, "run_id": 7},
        "topics": [{"label": "food", "confidence": 0.91}, {"label": "travel", "confidence": 0.72}],
        "quality": {"label": "good", "confidence": 0.6},  # the confidence orders model_review
        "agree": {"label": "2", "confidence": 0.6},
        "score": 40,  # on the slider's step of 5
        "entities": [{"start": shown.index("Zürich"), "end": shown.index("Zürich") + 6, "label": "LOC",
                      "confidence": 0.95}],  # the 0.2 span is below min_confidence
        "summary": "A short summary with \u0000 and \ud83d inside.",
    }
    assert records["i3"]["run_ids"] == {name: 7 for name in NAMES if name != "sentiment"}
    assert summary.written == {name: 2 if name in ("sentiment", "quality") else 1 for name in NAMES}
    assert summary.held_back == {name: {"trained_on": 1} for name in NAMES if name not in ("sentiment", "quality")}


@pytest.mark.parametrize("value, shown", [(120, 100), (-3, 0), (37.4, 35), (37.6, 40)])
def test_a_slider_prediction_is_kept_inside_its_range_on_its_step(tmp_path, value, shown):
    config = _project(tmp_path, schemas=("score",))
    write_back(config, 1, ["score"], _predictions(tmp_path / "p.jsonl", [{"id": "i2", "schema": "score",
                                                                          "value": value}]), tmp_path / "bundle")
    assert json.loads(writeback_path(config).read_text())["predictions"] == {"score": shown}


def test_nothing_to_prefill_and_min_confidence_hold_back_with_a_count(tmp_path):
    config = _project(tmp_path)
    rows = _every_kind("i2", topics={"label": [], "confidence": 0.9},  # an empty set shows nothing
                       entities={"spans": [{"start": 0, "end": 5, "label": "PER", "confidence": 0.1}]},
                       score={"value": 50, "confidence": 0.3},  # below min_confidence, with one
                       summary={"text": "kept: no confidence to compare"})
    summary = write_back(config, 2, NAMES, _predictions(tmp_path / "p.jsonl", rows), tmp_path / "bundle")
    assert summary.held_back == {"topics": {"nothing_to_show": 1}, "entities": {"nothing_to_show": 1},
                                 "score": {"below_confidence": 1}}
    assert "topics: 0 predictions (1 nothing to pre-fill)" in summary.describe()
    assert "score: 0 predictions (1 below min_confidence)" in summary.describe()


@pytest.mark.parametrize("row, why", [
    ({"schema": "topics", "label": "food", "confidence": 0.9}, "label is 'food', not a list of labels of 'topics'"),
    ({"schema": "topics", "label": ["food", "drinks"], "confidence": 0.9},
     "label is ['food', 'drinks'], not a list of labels of 'topics'"),
    ({"schema": "score", "value": "35"}, "value is '35', not a number"),
    ({"schema": "score", "value": 35, "confidence": 2}, "confidence is 2; use a number from 0 to 1"),
    ({"schema": "entities", "spans": [{"start": 5, "end": 5, "label": "PER"}]},
     "spans[0] runs from 5 to 5; start and end are whole character offsets, start before end"),
    ({"schema": "entities", "spans": [{"start": 0, "end": 5, "label": "ORG"}]},
     "spans[0].label is 'ORG', not a label of 'entities'"),
    ({"schema": "entities", "spans": {"start": 0}}, "spans is {'start': 0}, not a list of spans"),
    ({"schema": "summary", "text": 5}, "text is 5, not a string"),
    ({"schema": "quality", "label": "great", "confidence": 0.5}, "label is 'great', not a label of 'quality'"),
])
def test_a_bad_prediction_of_each_kind_is_named_by_its_field(tmp_path, row, why):
    config = _project(tmp_path)
    summary = write_back(config, 2, NAMES, _predictions(tmp_path / "p.jsonl", [{"id": "i2", **row}]),
                         tmp_path / "bundle")
    assert summary.bad_examples == [f"line 1: {why}"]
    with pytest.raises(ValueError, match="^" + why.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)").replace("{", r"\{").replace("}", r"\}") + "$"):
        parse_prediction({"id": "i2", **row}, KINDS, LABELS)


def test_an_earlier_runs_predictions_of_other_schemas_stay_whatever_their_shape(tmp_path):
    config = _project(tmp_path)
    write_back(config, 1, NAMES, _predictions(tmp_path / "p.jsonl", _every_kind("i3")), tmp_path / "bundle")
    first = json.loads(writeback_path(config).read_text("utf-8"))
    write_back(config, 2, ["sentiment"], _predictions(tmp_path / "p2.jsonl", [
        {"id": "i3", "schema": "sentiment", "label": "positive", "confidence": 0.99}]), tmp_path / "bundle")
    second = json.loads(writeback_path(config).read_text("utf-8"))
    assert second["predictions"]["sentiment"] == {"label": "positive", "confidence": 0.99, "run_id": 2}
    assert {k: v for k, v in second["predictions"].items() if k != "sentiment"} == \
        {k: v for k, v in first["predictions"].items() if k != "sentiment"}
    assert second["run_ids"] == first["run_ids"]


@pytest.mark.parametrize("record, problem", [
    ({"label": ["a", "b"], "confidence": 0.5}, None),
    ({"value": 3.5}, None),
    ({"spans": [{"start": 0, "end": 3, "label": "PER"}]}, None),
    ({"text": "\u0000 any string"}, None),
    ({}, "the line has no label, value, spans or text; each prediction has one"),
    ({"label": "a"}, "confidence is missing; a label comes with its confidence (a number from 0 to 1)"),
    ({"value": float("inf")}, "value is inf; use a finite number"),
    ({"label": {"a": 1}, "confidence": 1}, "label is {'a': 1}; use a label (a string) or a list of labels"),
    ({"spans": [{"start": 0, "end": 3, "label": "P\nER"}]}, "spans[0].label is 'P\\nER', not a label"),
    ({"text": ["a"]}, "text is ['a']; use a string"),
])
def test_the_upload_takes_every_kinds_fields_and_names_a_bad_one(record, problem):
    if problem is None:
        check_answer_fields(record)
    else:
        with pytest.raises(ValueError) as caught:
            check_answer_fields(record)
        assert str(caught.value) == problem


def test_each_kinds_holdout_evaluation(tmp_path):
    config = bundle_project(tmp_path)
    build_bundle(config, NAMES, tmp_path / "bundle", holdout_fraction=0.999999)
    # i0's gold: topics [people], agree 4, score 40, entities PER 0-5, PER 10-13, LOC 17-22, summary [Two people meet.]
    rows = [
        {"id": "i0", "schema": "topics", "label": ["people", "food"], "confidence": 0.6},
        {"id": "i0", "schema": "agree", "label": "4", "confidence": 0.9, "probs": [0, 0, 0.05, 0.9, 0.05]},
        {"id": "i0", "schema": "score", "value": 43.5},
        {"id": "i0", "schema": "entities", "spans": [{"start": 0, "end": 5, "label": "PER"},
                                                     {"start": 17, "end": 23, "label": "LOC"}]},
        {"id": "i0", "schema": "summary", "text": "Two people meet \ud83d"},  # any string JSON carries
    ]
    (tmp_path / "run").mkdir()
    _predictions(tmp_path / "run" / "predictions.jsonl", rows)
    evaluation = record_evaluation(5, tmp_path / "run", tmp_path / "bundle", NAMES)["schemas"]
    assert evaluation["topics"] == {
        "kind": "multilabel", "labels": ["food", "travel", "people"], "n": 1, "missing": 1, "exact_set": 0.0,
        "per_label": [{"label": "food", "tp": 0, "fp": 1, "fn": 0, "tn": 0},
                      {"label": "travel", "tp": 0, "fp": 0, "fn": 0, "tn": 1},
                      {"label": "people", "tp": 1, "fp": 0, "fn": 0, "tn": 0}]}  # i1's topics had no prediction
    assert evaluation["agree"]["kind"] == "ordinal" and evaluation["agree"]["accuracy"] == 1.0
    assert evaluation["agree"]["confusion"][3][3] == 1
    assert evaluation["score"] == {"kind": "continuous", "labels": [], "n": 1, "missing": 0, "mae": 3.5}
    assert evaluation["entities"]["per_label"] == [{"label": "PER", "tp": 1, "fp": 0, "fn": 1},
                                                   {"label": "LOC", "tp": 0, "fp": 1, "fn": 1}]
    assert evaluation["summary"] == {"kind": "text", "labels": [], "n": 1, "missing": 0, "exact_match": 0.0}
    assert "kind" not in evaluation["sentiment"]  # a nominal schema's evaluation is as it was
    lines = [json.loads(line) for line in (tmp_path / "run" / "labels.jsonl").read_text().splitlines()]
    score = next(line for line in lines if line["schema"] == "score")
    assert score == {"id": "i0", "schema": "score", "gold": 40, "holdout": True, "value": 43.5}
    summary = next(line for line in lines if line["schema"] == "summary")
    assert summary["gold"] == ["Two people meet."] and summary["text"] == "Two people meet \ud83d"


def test_span_predictions_for_an_item_potato_212_shows_from_another_text_are_not_written(tmp_path):
    config = _project(tmp_path)
    data = config.data_files[0]
    data.write_text(data.read_text("utf-8") + json.dumps({"id": "i4", "text": "x y z", "displayed_text": "<b>x</b>"})
                    + "\n" + json.dumps({"id": "i5", "text": ["turn one", "turn two"]}) + "\n", encoding="utf-8")
    build_bundle(config, NAMES, tmp_path / "bundle", holdout_fraction=0.0)
    items = {i["id"]: i for i in map(json.loads, (tmp_path / "bundle" / "items.jsonl").read_text("utf-8").splitlines())}
    assert items["i4"]["span_offsets"] is False and items["i5"]["span_offsets"] is False
    assert "span_offsets" not in items["i2"]
    rows = [{"id": i, "schema": "entities", "spans": [{"start": 0, "end": 1, "label": "PER"}]} for i in ("i4", "i5")]
    summary = write_back(config, 3, ["entities"], _predictions(tmp_path / "p.jsonl", rows), tmp_path / "bundle")
    assert summary.held_back == {"entities": {"nothing_to_show": 2}}


@pytest.mark.parametrize("scores, problem", [
    ({"topics": {"kind": "multilabel", "exact_match": 0.5, "micro_f1": 0.7, "macro_f1": 0.6, "n": 4}}, None),
    ({"score": {"kind": "continuous", "mae": 12.5, "spearman": -0.2, "n": 4}}, None),
    ({"entities": {"kind": "span", "precision": 1, "recall": 0.5, "f1": 0.667, "n": 4,
                   "per_label": {"PER": {"precision": 1.0, "recall": 0.5, "f1": 0.667, "n": 2}}}}, None),
    ({"summary": {"kind": "text", "exact_match": 0.25, "chrf": 61.2, "n": 4}}, None),
    ({"topics": {"kind": "sets"}}, "scores.topics.kind is 'sets'; use one of: nominal, ordinal, continuous, "
                                   "multilabel, span, text, comparison, best_worst, ranking"),
    ({"score": {"kind": "continuous", "spearman": 1.5}}, "scores.score.spearman is 1.5; use a number from -1 to 1"),
    ({"score": {"kind": "continuous", "mae": -1}}, "scores.score.mae is -1; use a number of at least 0"),
    ({"entities": {"per_label": {"PER": {"f1": "high"}}}},
     "scores.entities.per_label.PER.f1 is 'high'; use a number or null"),
    ({"entities": {"per_label": {"PER": 0.5}}},
     "scores.entities.per_label.PER is 0.5; use a JSON object {label: {metric: number}}"),
    ({"entities": {"per_label": {"P\nER": {}}}},
     "scores.entities.per_label has a label named 'P\\nER'; use a string of at most 300 characters without "
     "control characters"),
])
def test_the_protocol_takes_each_kinds_metrics_and_names_a_bad_one(scores, problem):
    from potato.protocol.bodies import BadField, check_scores

    if problem is None:
        assert check_scores(scores) == scores
    else:
        with pytest.raises(BadField) as caught:
            check_scores(scores)
        assert str(caught.value) == problem
