"""Pairwise comparisons, from user_state.json as Potato 2.12.1 writes them to the bundle, the holdout and the checks.

2.12.1 stores a binary pairwise answer as ``[{"schema": S, "name":
"selection"}, "A"]`` (``B``, or ``tie`` with ``allow_tie``), a scale one as
``[{"schema": S, "name": "scale_value"}, "-2"]`` (below 0 the first response
is better), a justification beside either under ``justification``; with
``randomize_order`` the order each annotator saw the two responses in goes to
``instance_id_to_presentation_order`` (``{item: {schema: [1, 0]}}``: the
item's second response was shown first, as ``A``).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from potato.annotations.aggregation import comparison_counts
from potato.annotations.annotator_answers import read_answers
from potato.bundle.build import build_bundle, describe_bundle
from potato.config import Scheme
from potato.prefill.prediction_shapes import parse_prediction
from potato.training.answer_kinds import COMPARISON, UNSUPPORTED, majority_side
from potato.training.trainers.answers import SchemaAnswers
from potato.training.trainers.metrics import holdout_scores
from tests.support.answer_project import pair, write_state
from tests.support.potato_project import make_project, project_config
from tests.unit.test_config import build, seed_dict

PREF = Scheme("pref", "pairwise", ("A", "B"), mode="binary", items_key="responses")
GRADE = Scheme("grade", "pairwise", ("A", "B"), mode="scale", items_key="responses", min_value=-3, max_value=3)
ITEMS = [{"id": "p0", "text": "Say hi.", "responses": ["Hello!", "Go away."]},
         {"id": "p1", "text": "Add 2+2.", "responses": ["4", "5"]},
         {"id": "p2", "text": "No pair.", "responses": "just one"}]


def _project(tmp_path):
    """ITEMS with PREF and GRADE: alice and bob answered (2.12 showed bob p0's responses swapped for PREF)."""
    make_project(tmp_path, n_items=0)
    config = project_config(tmp_path / "config.yaml")
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in ITEMS), encoding="utf-8")
    config = replace(config, schemes=(PREF, GRADE), data_files=(data,))
    out = config.output_annotation_dir
    write_state(out, "alice", {
        "p0": [pair("pref", "selection", "A"), pair("pref", "justification", "kinder"),
               pair("grade", "scale_value", "-2")],
        "p1": [pair("pref", "selection", "tie"), pair("grade", "scale_value", "0")],
        "p2": [pair("pref", "selection", "C")],
    })
    write_state(out, "bob", {"p0": [pair("pref", "selection", "B"), pair("grade", "scale_value", "3")],
                             "p1": [pair("pref", "selection", "A"), pair("grade", "scale_value", "x")]})
    state_path = out / "bob" / "user_state.json"
    state = json.loads(state_path.read_text(encoding="utf-8"))
    state["instance_id_to_presentation_order"] = {"p0": {"pref": [1, 0]}, "p1": {"pref": [0, 1]}}
    state_path.write_text(json.dumps(state), encoding="utf-8")
    return config


def test_each_side_is_read_on_the_items_own_order_and_what_is_not_a_side_is_named(tmp_path):
    config = _project(tmp_path)
    out = config.output_annotation_dir
    answers = read_answers(out, (PREF, GRADE), base=out)
    # bob's B on p0 was the item's first response (shown second): A. A justification is not an answer.
    assert answers.choices == {"pref": {"p0": ["A", "A"], "p1": ["tie", "A"]},
                               "grade": {"p0": ["A", "B"], "p1": ["tie"]}}
    assert answers.skipped_answers == 2
    assert answers.warnings == [
        "alice/user_state.json: item(s) 'p2' have 'C' for schema 'pref', which is not A, B or tie; those answers "
        "were skipped",
        "bob/user_state.json: item(s) 'p1' have 'x' for schema 'grade', which is not a number; those answers "
        "were skipped",
    ]


def test_without_a_recorded_order_the_sides_are_taken_as_shown(tmp_path):
    config = _project(tmp_path)
    out = config.output_annotation_dir
    state_path = out / "bob" / "user_state.json"
    state = json.loads(state_path.read_text(encoding="utf-8"))
    del state["instance_id_to_presentation_order"]
    state_path.write_text(json.dumps(state), encoding="utf-8")
    answers = read_answers(out, (PREF,), base=out)
    assert answers.choices == {"pref": {"p0": ["A", "B"], "p1": ["tie", "A"]}}


def test_counts_keep_how_sure_the_annotators_were_and_the_majority_is_the_side_more_chose():
    coded, ties = comparison_counts({"p0": ["A", "A", "B"], "p1": ["tie", "B"], "p2": ["A", "B", "tie"]})
    assert [coded.decode(coded.per_item[item]) for item in ("p0", "p1", "p2")] == [
        {"A": 2, "B": 1, "tie": 0}, {"A": 0, "B": 1, "tie": 1}, {"A": 1, "B": 1, "tie": 1}]
    assert ties == 1
    assert [majority_side(c) for c in ({"A": 2, "B": 1}, {"B": 1, "tie": 3}, {"A": 1, "B": 1}, {})] == [
        "A", "B", "tie", "tie"]


def test_the_bundle_holds_the_counts_and_both_responses_and_names_items_without_two(tmp_path):
    config = _project(tmp_path)
    info = build_bundle(config, ["pref", "grade"], tmp_path / "bundle", holdout_fraction=0.0)
    items = {item["id"]: item for item in map(json.loads, (tmp_path / "bundle" / "items.jsonl").read_text(
        "utf-8").splitlines())}
    assert items["p0"]["labels"] == {"pref": {"A": 2, "B": 0, "tie": 0}, "grade": {"A": 1, "B": 1, "tie": 0}}
    assert items["p0"]["sides"] == {"pref": ["Hello!", "Go away."], "grade": ["Hello!", "Go away."]}
    assert items["p1"]["labels"] == {"pref": {"A": 1, "B": 0, "tie": 1}, "grade": {"A": 0, "B": 0, "tie": 1}}
    assert items["p2"]["labels"] == {} and "sides" not in items["p2"]
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text("utf-8"))
    assert manifest["answers"] == {
        "pref": {"type": "pairwise", "kind": "comparison", "mode": "binary", "items_key": "responses"},
        "grade": {"type": "pairwise", "kind": "comparison", "mode": "scale", "items_key": "responses"}}
    for schema in ("pref", "grade"):
        assert (f"item(s) 'p2' have no two responses to compare for schema {schema!r}: their field 'responses' is "
                f"not a list of two texts (the schema's items_key); no comparison of them is trained or "
                f"predicted") in info.warnings
    assert describe_bundle(info).endswith(
        "pref: 2 labelled (A 2, B 0, tie 0; 0 held out, 0 ties); grade: 2 labelled (A 0, B 0, tie 2; 0 held out, "
        "2 ties)")


# --------------------------------------------------------------------------- the holdout


def test_agreement_counts_the_majority_and_each_annotator_and_leaves_tied_majorities_out():
    gold = [{"A": 3, "B": 0, "tie": 0}, {"A": 1, "B": 2, "tie": 0}, {"A": 1, "B": 1, "tie": 1},
            {"A": 0, "B": 0, "tie": 2}]
    scores = holdout_scores(gold, ["A", "A", "B", "A"], COMPARISON, ["A", "B"])
    # Majorities: A, B (two decided items, one matched); the annotators chose a side 8 times, 3 + 1 + 1 matched.
    assert scores == {"kind": "comparison", "n": 4, "agreement": 0.5, "annotator_agreement": 0.625, "decided": 2}


@pytest.mark.parametrize("value, gold", [
    ({"A": 2, "B": 1, "tie": 0}, {"A": 2, "B": 1, "tie": 0}),
    ({"B": 1}, {"A": 0, "B": 1, "tie": 0}),
    ({"A": 0, "B": 0, "tie": 0}, None),
    ({"A": -1, "B": 2}, None),
    ({"A": True}, None),
    ("A", None),
])
def test_a_trainer_takes_counts_only(value, gold):
    answers = SchemaAnswers("pref", ["A", "B"], {"kind": COMPARISON})
    assert answers.gold(value) == gold


def test_a_comparison_prediction_is_a_side_with_its_probability():
    kinds, labels = {"pref": COMPARISON}, {"pref": ["A", "B"]}
    prediction = parse_prediction({"id": "p0", "schema": "pref", "label": "B", "confidence": 0.8,
                                   "probs": [0.2, 0.8]}, kinds, labels)
    assert (prediction.answer, prediction.confidence, prediction.probs) == ("B", 0.8, [0.2, 0.8])
    with pytest.raises(ValueError, match="label is 'tie', not a label of 'pref'"):
        parse_prediction({"id": "p0", "schema": "pref", "label": "tie", "confidence": 0.5}, kinds, labels)
    with pytest.raises(ValueError, match="confidence is None; use a number from 0 to 1"):
        parse_prediction({"id": "p0", "schema": "pref", "label": "A"}, kinds, labels)


# --------------------------------------------------------------------------- the config


def _pairwise_config(tmp_path, writeback=("sentiment",), **entry):
    raw = seed_dict()
    raw["annotation_schemes"].append(dict(entry, name="pref", description="Which answer is better?"))
    raw["model_training"]["writeback"]["schemas"] = list(writeback)
    return build(tmp_path, raw)


def test_a_pairwise_scheme_reads_its_mode_items_key_and_scale(tmp_path):
    result = _pairwise_config(tmp_path, annotation_type="pairwise", mode="scale", items_key="answers",
                              randomize_order=True, scale={"min": -5, "max": 5})
    assert result.errors == ()
    scheme = result.config.scheme("pref")
    assert (scheme.kind, scheme.labels, scheme.mode, scheme.items_key, scheme.min_value, scheme.max_value) == (
        COMPARISON, ("A", "B"), "scale", "answers", -5, 5)
    binary = _pairwise_config(tmp_path, annotation_type="pairwise", labels=["Left", "Right"]).config.scheme("pref")
    # The tiles' names do not change what is stored: A or B.
    assert (binary.kind, binary.labels, binary.mode, binary.items_key) == (COMPARISON, ("A", "B"), "binary", "text")


@pytest.mark.parametrize("entry, message", [
    ({"mode": "weird"}, "annotation_schemes[1].mode (scheme 'pref') is 'weird'; use one of binary, scale, "
                        "multi_dimension"),
    ({"mode": "scale", "scale": {"min": 0, "max": 5}},
     "annotation_schemes[1].scale (scheme 'pref') is {'min': 0, 'max': 5}; a pairwise scale runs from a negative "
     "min (the first response better) through 0 to a positive max (the second)"),
    ({"items_key": ""}, "annotation_schemes[1].items_key (scheme 'pref') is ''; name the item's field that holds "
                        "the two responses"),
])
def test_a_pairwise_scheme_that_cannot_be_read_is_named_with_the_fix(tmp_path, entry, message):
    result = _pairwise_config(tmp_path, annotation_type="pairwise", **entry)
    assert [issue.message for issue in result.errors] == [message]


def test_a_comparison_is_written_back_only_under_model_review_because_potato_212_prefills_none(tmp_path):
    result = _pairwise_config(tmp_path, ("sentiment", "pref"), annotation_type="pairwise")
    assert [issue.message for issue in result.errors] == [
        "model_training.writeback.schemas[1] is 'pref', a pairwise schema: Potato 2.12 pre-fills nothing for one, "
        "so writing it back only orders the items, and only under assignment_strategy: model_review (the "
        "comparisons the model is least sure of first); set assignment_strategy: model_review, or remove it from "
        "writeback.schemas (its predictions stay in the run's predictions.jsonl and on its run page)"]
    raw = seed_dict()
    raw["annotation_schemes"].append({"annotation_type": "pairwise", "name": "pref", "description": "Which?"})
    raw["model_training"]["writeback"]["schemas"] = ["sentiment", "pref"]
    raw["assignment_strategy"] = "model_review"
    assert build(tmp_path, raw).errors == ()


@pytest.mark.parametrize("entry, why", [
    ({"annotation_type": "pairwise", "mode": "multi_dimension"},
     "(pairwise): a pairwise schema in mode multi_dimension (one answer per dimension) is not trained yet; mode "
     "binary or scale is"),
])
def test_the_comparisons_not_trained_yet_say_so_and_what_is(tmp_path, entry, why):
    result = _pairwise_config(tmp_path, ("sentiment", "pref"), **entry)
    assert result.config is None or result.config.scheme("pref").kind == UNSUPPORTED
    assert [issue.message for issue in result.errors] == [
        "model_training.writeback.schemas[1] is 'pref': No trainer can train schema 'pref' " + why]


def test_responses_holding_any_string_json_can_carry_reach_the_bundle_as_they_are(tmp_path):
    config = _project(tmp_path)
    odd = ["lone \ud800 surrogate, NUL \x00, <b>&amp;</b>, 😀", "x" * 200_000]
    lines = config.data_files[0].read_text("utf-8").splitlines()
    lines[0] = json.dumps({"id": "p0", "text": "Say hi.", "responses": odd})
    config.data_files[0].write_text("\n".join(lines) + "\n", encoding="utf-8")
    build_bundle(config, ["pref"], tmp_path / "bundle", holdout_fraction=0.0)
    first = (tmp_path / "bundle" / "items.jsonl").read_text("utf-8").splitlines()[0]
    assert json.loads(first)["sides"] == {"pref": odd}
