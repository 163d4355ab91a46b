"""A run with several trainers, in the pieces that need no training: job.json's parts, events, the step row."""

from __future__ import annotations

import pytest

from potato.runs.run_events import describe_progress
from potato.training.claims import BadClaim, check_claim
from potato.training.events import EventWriter, read_events
from potato.training.parts import check_parts
from tests.support.claims import make_claim

TWO = [{"trainer": "hf-text-classification", "schemas": ["sentiment"], "options": {}},
       {"trainer": "hf-span-tagging", "schemas": ["entities"]}]


@pytest.mark.parametrize("parts, problem", [
    (None, None),
    (TWO, None),
    (TWO[:1], "parts is [{'trainer': 'hf-text-classification', 'schemas': ['sentiment'], 'options': {}}]; "
              "expected a list of two or more parts"),
    ([TWO[0], "hf-span-tagging"], "parts[1] is 'hf-span-tagging'; expected an object with trainer, schemas and "
                                  "options"),
    ([TWO[0], {"trainer": 3, "schemas": ["x"]}], "parts[1].trainer is 3; expected a trainer's name"),
    ([TWO[0], {"trainer": "t", "schemas": "x"}], "parts[1].schemas is 'x'; expected a list of schema names"),
    ([TWO[0], {"trainer": "t", "schemas": ["x"], "options": []}], "parts[1].options is []; expected an object"),
])
def test_job_parts_are_checked_naming_the_field(parts, problem):
    assert check_parts(parts) == problem


def test_an_agent_refuses_a_claim_whose_parts_are_not_parts():
    claim = make_claim()
    claim["job"]["parts"] = TWO[:1]
    with pytest.raises(BadClaim) as caught:
        check_claim(claim)
    assert str(caught.value).startswith("job.parts is [")
    claim["job"]["parts"] = TWO
    assert check_claim(claim)["job"]["parts"] == TWO


def test_a_parts_progress_names_it_and_its_metrics_carry_the_schemas_before_it(tmp_path):
    events = EventWriter(str(tmp_path / "events.jsonl"))
    scores = {"sentiment": {"kind": "nominal", "accuracy": 1.0, "n": 4}}
    events.set_part({"trainer": "hf-span-tagging", "part": 2, "parts": 2}, scores)
    events.progress("train", 3, 10, force=True, schema="entities")
    events.metrics({"entities": {"kind": "span", "f1": 0.5, "n": 4}})
    events.set_part(None)
    events.progress("predict", 1, 1, schema="x")
    written = read_events(str(tmp_path / "events.jsonl"))[0]
    assert {k: written[0][k] for k in ("trainer", "part", "parts", "schema")} == {
        "trainer": "hf-span-tagging", "part": 2, "parts": 2, "schema": "entities"}
    assert written[1]["scores"] == {**scores, "entities": {"kind": "span", "f1": 0.5, "n": 4}}
    assert "part" not in written[2]


def test_the_step_row_names_the_part_and_its_bar_counts_the_whole_run():
    event = {"phase": "train", "step": 3, "total": 10, "epoch": 1, "loss": 0.5, "trainer": "hf-span-tagging",
             "part": 2, "parts": 2}
    assert describe_progress(event) == ("hf-span-tagging (2 of 2): training: step 3 of 10 (epoch 1), loss 0.5000",
                                        0.65)
    assert describe_progress({"phase": "predict", "step": 1, "total": 4}) == ("predicting: batch 1 of 4", 0.25)


def test_scores_are_worded_once_for_every_page_and_command():
    from potato.follow import format_scores
    from potato.text.score_text import score_line, score_lines, table_rows

    nominal = {"kind": "nominal", "accuracy": 0.95, "macro_f1": 0.949, "n": 40}
    spans = {"kind": "span", "precision": 1.0, "recall": 0.5, "f1": 0.667, "n": 4,
             "per_label": {"PER": {"f1": 0.667}}}
    assert score_line("sentiment", nominal) == "sentiment: accuracy 0.950, macro-F1 0.949 (n=40)"
    assert score_line("sentiment", 0.9) == "sentiment: ?"
    assert score_line("sentiment", {"ece_before": 0.12, "ece_after": 0.031, "kept": True}) == \
        "sentiment: ECE 0.120 -> 0.031 (kept)"
    assert score_lines({"b": nominal, "a": nominal})[0].startswith("a: ")
    assert format_scores({"sentiment": nominal}) == "sentiment acc 0.950 F1 0.949"
    assert format_scores({"entities": spans}) == score_line("entities", spans)  # each kind's own words
    assert table_rows({"entities": spans}) == [{"schema": "entities", "kind": "span", "scores": score_line(
        "entities", spans), "precision": 1.0, "recall": 0.5, "f1": 0.667, "n": 4}]  # flat: Prefect's table
