"""The run's report for Prefect's Artifacts page: per-label scores from the holdout evaluation, and its Markdown."""

from __future__ import annotations

import pytest

from potato.results.run_report import LABEL_SCORES, REPORT, artifact_key, label_rows, report_markdown

EVALUATION = {"schemas": {
    # rows gold, columns predicted: 'pos' 8 right, 2 taken for 'neg'; 'neg' 9 right, 1 taken for 'pos'
    "sentiment": {"labels": ["pos", "neg"], "confusion": [[8, 2], [1, 9]], "n": 20},
    "topics": {"kind": "multilabel", "labels": ["a|b"], "per_label": [{"label": "a|b", "tp": 3, "fp": 1, "fn": 0,
                                                                        "tn": 6}]},
    "entities": {"kind": "span", "labels": ["FOOD"], "per_label": [{"label": "FOOD", "tp": 0, "fp": 0, "fn": 4}]},
    "stars": {"kind": "continuous", "labels": [], "mae": 0.5},
}}
SCORES = {"sentiment": {"kind": "nominal", "accuracy": 0.85, "macro_f1": 0.849, "n": 20}}


def test_each_label_s_precision_recall_and_f1_come_from_the_confusion_matrix_or_the_counts():
    rows = {(r["schema"], r["label"]): r for r in label_rows(EVALUATION)}
    assert rows[("sentiment", "pos")] == {"schema": "sentiment", "label": "pos", "precision": round(8 / 9, 4),
                                          "recall": 0.8, "f1": round(16 / 19, 4), "held_out": 10}
    assert rows[("sentiment", "neg")]["precision"] == round(9 / 11, 4)
    assert rows[("topics", "a|b")] == {"schema": "topics", "label": "a|b", "precision": 0.75, "recall": 1.0,
                                       "f1": round(6 / 7, 4), "held_out": 3}
    # Nothing predicted: precision has nothing to count, and is said to be missing rather than 0.
    assert rows[("entities", "FOOD")] == {"schema": "entities", "label": "FOOD", "precision": None, "recall": 0.0,
                                          "f1": 0.0, "held_out": 4}
    assert not [key for key in rows if key[0] == "stars"]  # a number has no labels
    assert label_rows(None) == [] and label_rows({"schemas": {"x": "not a mapping"}}) == []


def test_the_report_says_the_scores_per_label_and_why_a_schema_was_held_back():
    gate = {"schemas": [{"schema": "sentiment", "written": False, "rule": "baseline",
                         "text": "sentiment: holdout accuracy 0.85 is no better than always answering `pos`; "
                                 "its predictions were not written back"}]}
    text = report_markdown(7, "Review *sentiment*", SCORES, EVALUATION, gate, None,
                           "http://127.0.0.1:8000/admin/training/runs/7")
    lines = text.splitlines()
    assert lines[0] == "# Run 7 of Review \\*sentiment\\*"  # a project's name is escaped, not rendered
    assert "[The run's page](http://127.0.0.1:8000/admin/training/runs/7)" in lines
    assert "- sentiment: accuracy 0.850, macro-F1 0.849 (n=20)" in lines
    assert "### Per label: sentiment" in lines
    assert "| pos | 0.889 | 0.800 | 0.842 | 10 |" in lines
    assert "| a\\|b | 0.750 | 1.000 | 0.857 | 3 |" in lines  # a pipe in a label does not end the cell
    assert "| FOOD | - | 0.000 | 0.000 | 4 |" in lines
    held = lines.index("## What annotators see")
    assert lines[held + 2] == ("- sentiment: holdout accuracy 0.85 is no better than always answering \\`pos\\`; "
                               "its predictions were not written back")


def test_the_report_of_a_run_written_back_gives_the_writeback_s_counts():
    writeback = {"items_prefilled": 12, "schemas": ["sentiment"], "written": {"sentiment": 12},
                 "held_back": {}, "gate": ["sentiment: holdout accuracy 0.85 beats always answering `pos` (0.50) "
                                           "on 20 held-out answers: written back"]}
    lines = report_markdown(8, "p", SCORES, EVALUATION, None, writeback).splitlines()
    seen = lines[lines.index("## What annotators see") + 2:]
    assert seen[:2] == ["- 12 item(s) pre-filled", "- sentiment: 12 predictions written; none held back"]
    assert seen[2].startswith("- sentiment: holdout accuracy 0.85 beats")
    assert not [line for line in lines if line.startswith("[The run's page]")]  # no page recorded: no link


def test_artifact_keys_are_per_project_and_what_prefect_accepts():
    assert artifact_key("review-sentiment-3f9a1c", REPORT) == "potato-review-sentiment-3f9a1c-report"
    assert artifact_key("p-000000", LABEL_SCORES) == "potato-p-000000-label-scores"
    with pytest.raises(ValueError, match="not a Prefect artifact key: 'potato-Bad Key-report'"):
        artifact_key("Bad Key", REPORT)


def test_a_lone_surrogate_in_a_label_or_a_name_reaches_prefect_as_its_escape():
    evaluation = {"schemas": {"tone\ud800": {"labels": ["ok\udc00", "bad"], "confusion": [[1, 0], [0, 1]]}}}
    rows = label_rows(evaluation)
    assert [(r["schema"], r["label"]) for r in rows] == [("tone\\ud800", "ok\\udc00"), ("tone\\ud800", "bad")]
    text = report_markdown(3, "Tickets \ud83d", {"tone\ud800": {"kind": "nominal", "accuracy": 1.0, "n": 2}},
                           evaluation, None, None)
    text.encode("utf-8")  # what Prefect's API sends: it must encode
    assert text.splitlines()[0] == "# Run 3 of Tickets \\ud83d"
    assert "| ok\\\\udc00 | 1.000 | 1.000 | 1.000 | 1 |" in text.splitlines()
