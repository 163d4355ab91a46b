"""Every answer type, from user_state.json as Potato 2.12.1 writes it to the bundle's labels.

The files are written as 2.12.1 writes them (checked against its own
``/updateinstance`` and its page in a browser): a slider's number as text
under ``<schema>:slider``, a text box under ``<schema>:text_box``, a likert
without ``labels:`` as its point's number, spans under
``instance_id_to_span_to_value`` in both the forms 2.12.1 writes (its page:
id ``<schema>_<label>_<s>_<e>`` and value 1; its ``/updateinstance``: id
``<schema>_<label>___<s>_<e>`` and the covered text).
"""

from __future__ import annotations

import json

import pytest

from potato.annotations.aggregation import aggregate, majority_label_sets, majority_spans, median_points
from potato.annotations.annotator_answers import read_answers
from potato.annotations.labels import read_votes
from potato.bundle.build import build_bundle, describe_bundle
from tests.support.answer_project import ALL, TOPICS, bundle_project, write_state
from tests.support.answer_project import pair as _pair
from tests.support.answer_project import span as _span


def test_numbers_texts_spans_and_who_answered_are_read_as_potato_212_writes_them(tmp_path):
    write_state(tmp_path, "alice", {
        "i0": [_pair("sentiment", "positive", "positive"), _pair("score", "slider", "35"),
               _pair("summary", "text_box", "A <b>summary</b> & more\nline2")],
        "i1": [_pair("sentiment", "negative", "negative")],
    }, {"i0": [_span("entities", "PER", 0, 5), _span("entities", "LOC", 17, 22, page=False)],
        "i2": [_span("entities", "PER", 6, 11)]})
    write_state(tmp_path, "bob", {"i0": [_pair("score", "slider", 40), _pair("summary", "text_box", "")]})
    answers = read_answers(tmp_path, ALL)
    assert answers.answered == {"i0": 2, "i1": 1, "i2": 1}
    assert answers.values == {"score": {"i0": [35.0, 40.0]}, "summary": {"i0": ["A <b>summary</b> & more\nline2"]}}
    assert answers.spans == {"entities": {"i0": [("alice", 0, 5, "PER"), ("alice", 17, 22, "LOC")],
                                          "i2": [("alice", 6, 11, "PER")]}}
    assert answers.warnings == [] and answers.skipped_answers == 0


def test_answers_a_schema_does_not_take_are_skipped_and_named(tmp_path):
    write_state(tmp_path, "alice", {"i0": [_pair("score", "slider", "fast")], "i1": [_pair("score", "slider", "NaN")]},
                {"i0": [_span("entities", "ORG", 0, 3), _span("entities", "PER", 4, 4)]})
    answers = read_answers(tmp_path, ALL, base=tmp_path)
    assert answers.values == {"score": {}, "summary": {}} and answers.spans == {"entities": {}}
    assert answers.skipped_answers == 4
    assert answers.warnings == [
        "alice/user_state.json: item(s) 'i0' have 'fast' for schema 'score', which is not a number; those "
        "answers were skipped",
        "alice/user_state.json: item(s) 'i1' have 'NaN' for schema 'score', which is not a number; those "
        "answers were skipped",
        "alice/user_state.json: item(s) 'i0' have spans labelled 'ORG' for schema 'entities', which is not one "
        "of its labels; those spans were skipped",
        "alice/user_state.json: item(s) 'i0' have spans of schema 'entities' whose start is not a whole number "
        "before their end; those spans were skipped",
    ]


def test_a_file_the_fast_reader_gives_up_on_is_read_carefully(tmp_path, monkeypatch):
    from potato.annotations import labels as module
    from potato.annotations.json_chunks import GiveUp

    def gives_up(path, members):
        keys, texts = ["i0"], [b"t"]
        yield "instance_id_to_label_to_value", (keys, texts, {b"t": [_pair("score", "slider", "99")]})  # taken back
        raise GiveUp

    write_state(tmp_path, "alice", {"i0": [_pair("score", "slider", "35")]}, {"i0": [_span("entities", "PER", 0, 5)]})
    monkeypatch.setattr(module, "_fast_batches", gives_up)
    answers = read_answers(tmp_path, ALL)
    assert answers.values["score"] == {"i0": [35.0]} and answers.spans["entities"] == {"i0": [("alice", 0, 5, "PER")]}


def test_a_bundle_reads_each_annotators_file_once(tmp_path, monkeypatch):
    """Votes (radio, multiselect) and the other answers (slider, text, spans) come from one pass."""
    import builtins

    config = bundle_project(tmp_path)
    files = sorted(str(p) for p in config.output_annotation_dir.glob("*/user_state.json"))
    opened = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if str(file).endswith("user_state.json"):
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    info = build_bundle(config, [s.name for s in ALL], tmp_path / "bundle", holdout_fraction=0.0)
    assert info.labeled["entities"] == 2 and info.labeled["topics"] == 2
    assert len(files) == 3 and sorted(opened) == files


# --------------------------------------------------------------------------- aggregation rules


def test_an_ordinal_answer_is_the_median_point_and_a_split_pair_takes_the_lower():
    pack = lambda *counts: sum(c << (16 * i) for i, c in enumerate(counts))  # noqa: E731
    per_item = {"a": pack(0, 1, 1, 0, 1), "b": pack(1, 0, 0, 0, 1), "c": pack(0, 0, 0, 2, 0)}
    assert median_points(per_item, 5) == ({"a": 2, "b": 0, "c": 3}, 1)


def test_a_label_is_in_the_set_when_at_least_half_the_items_annotators_ticked_it():
    pack = lambda *counts: sum(c << (16 * i) for i, c in enumerate(counts))  # noqa: E731
    masks, ties = majority_label_sets({"a": pack(2, 1, 0), "b": pack(1, 0, 0), "c": pack(3, 2, 1)},
                                      {"a": 3, "b": 2, "c": 3, "d": 2}, 3)
    assert masks == {"a": 0b001, "b": 0b001, "c": 0b011, "d": 0}  # d: saved, nothing ticked
    assert ties == 1  # b's food at exactly half


def test_spans_are_decided_character_by_character():
    order = {"PER": 0, "LOC": 1}
    spans = [("a", 0, 5, "PER"), ("b", 0, 4, "PER"), ("c", 1, 5, "PER"),  # boundaries differ, the core agrees
             ("a", 10, 15, "LOC"), ("b", 10, 12, "LOC"),  # two of three: on at least half? 10-12 yes, 12-15 no
             ("a", 20, 25, "PER"), ("a", 22, 27, "PER")]  # one annotator's overlap counts once
    assert majority_spans(spans, 3, order) == [(0, 5, "PER"), (10, 12, "LOC")]
    assert majority_spans(spans, 4, order) == [(0, 5, "PER"), (10, 12, "LOC")]  # 2 of 4 is half
    assert majority_spans([("a", 0, 3, "LOC"), ("b", 0, 3, "PER")], 2, order) == [(0, 3, "PER")]
    assert majority_spans([], 2, order) == []


def test_every_kind_aggregates_from_three_annotators(tmp_path):
    entries = {
        "alice": {"i0": [_pair("topics", "food", "food"), _pair("topics", "travel", "travel"),
                         _pair("quality", "good", "good"), _pair("agree", "2", "2"), _pair("score", "slider", "35"),
                         _pair("summary", "text_box", "one")]},
        "bob": {"i0": [_pair("topics", "food", "food"), _pair("quality", "ok", "ok"), _pair("agree", "3", "3"),
                       _pair("score", "slider", "40"), _pair("summary", "text_box", "two")]},
        "carol": {"i0": [_pair("sentiment", "negative", "negative"), _pair("agree", "5", "5"),
                         _pair("score", "slider", "100")]},
    }
    spans = {"alice": {"i0": [_span("entities", "PER", 0, 5)]}, "bob": {"i0": [_span("entities", "PER", 0, 5)]}}
    for user, entry in entries.items():
        write_state(tmp_path, user, entry, spans.get(user))
    voted = [s for s in ALL if s.kind in ("nominal", "ordinal", "multilabel")]
    votes = read_votes(tmp_path, voted)
    result = aggregate(votes, read_answers(tmp_path, ALL), ALL, consensus=False)
    decoded = {name: c.decode(c.per_item["i0"]) for name, c in result.coded.items()}
    assert decoded == {"sentiment": "negative", "topics": ["food"], "quality": "ok", "agree": "3", "score": 40}
    assert result.rich == {"entities": {"i0": [(0, 5, "PER")]}, "summary": {"i0": ["one", "two"]}}
    assert result.ties["quality"] == 1  # good and ok: two answers, the lower middle


def test_consensus_decides_each_multiselect_label_by_dawid_skene(tmp_path):
    # Two careful annotators agree everywhere; a third ticks "travel" on everything.
    for user in ("alice", "bob", "carol"):
        entries = {}
        for i in range(30):
            ticked = ["food"] if i % 2 else []
            if user == "carol":
                ticked = ticked + ["travel"]
            entries[f"i{i}"] = [_pair("topics", t, t) for t in ticked] + [_pair("sentiment", "positive", "positive")]
        write_state(tmp_path, user, entries)
    votes = read_votes(tmp_path, [TOPICS], per_user=True)
    result = aggregate(votes, read_answers(tmp_path, [TOPICS], per_user=True), [TOPICS], consensus=True)
    coded = result.coded["topics"]
    assert {coded.decode(coded.per_item[f"i{i}"]) == (["food"] if i % 2 else []) for i in range(30)} == {True}


# --------------------------------------------------------------------------- the bundle


def test_the_bundle_holds_each_kinds_answer_in_its_documented_shape(tmp_path):
    config = bundle_project(tmp_path)
    info = build_bundle(config, [s.name for s in ALL], tmp_path / "bundle", holdout_fraction=0.0)
    items = [json.loads(line) for line in (tmp_path / "bundle" / "items.jsonl").read_text("utf-8").splitlines()]
    labels = {item["id"]: item["labels"] for item in items}
    text_of = {item["id"]: item["text"] for item in items}
    # Two annotators: what one of them marked is at half, so it stays (Bob).
    assert labels["i0"] == {"topics": ["people"], "agree": "4", "score": 40, "summary": ["Two people meet."],
                            "entities": [{"start": 0, "end": 5, "label": "PER"}, {"start": 10, "end": 13, "label": "PER"},
                                         {"start": 17, "end": 22, "label": "LOC"}]}
    # i1: bob saved only spans; his "no topic" and "no sentiment" count for topics (a set) but not for radio.
    assert labels["i1"] == {"sentiment": "positive", "topics": ["food"],
                            "entities": [{"start": 13, "end": 18, "label": "PER"}, {"start": 55, "end": 57, "label": "LOC"}]}
    assert [text_of["i1"][s["start"]:s["end"]] for s in labels["i1"]["entities"]] == ["Jerry", "ok"]
    assert labels["i2"] == labels["i3"] == {}
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["schemas"] == {"sentiment": ["positive", "negative"], "topics": ["food", "travel", "people"],
                                   "quality": ["bad", "ok", "good"], "agree": ["1", "2", "3", "4", "5"], "score": [],
                                   "entities": ["PER", "LOC"], "summary": []}
    assert manifest["answers"] == {
        "sentiment": {"type": "radio", "kind": "nominal"},
        "topics": {"type": "multiselect", "kind": "multilabel"},
        "quality": {"type": "likert", "kind": "ordinal", "values": [1, 2, 3]},
        "agree": {"type": "likert", "kind": "ordinal", "values": [1, 2, 3, 4, 5]},
        "score": {"type": "slider", "kind": "continuous", "min": 0, "max": 100, "step": 5},
        "entities": {"type": "span", "kind": "span"},
        "summary": {"type": "text", "kind": "text", "description": "Summarize the item in one sentence."},
    }
    assert info.labeled == {"sentiment": 1, "topics": 2, "quality": 0, "agree": 1, "score": 1, "entities": 2,
                            "summary": 1}
    assert describe_bundle(info) == (
        "Bundle: 4 items from 3 annotators; sentiment: 1 labelled (positive 1, negative 0; 0 held out, 0 ties); "
        "topics: 2 labelled (food 1, travel 0, people 1; 0 held out, 1 ties); quality: 0 labelled (bad 0, ok 0, "
        "good 0; 0 held out, 0 ties); agree: 1 labelled (1 0, 2 0, 3 0, 4 1, 5 0; 0 held out, 1 ties); score: 1 "
        "labelled (from 40 to 40, mean 40; 0 held out, 0 ties); entities: 2 labelled (PER 3, LOC 2; 0 held out, "
        "0 ties); summary: 1 labelled (1 answer; 0 held out, 0 ties)")


def test_spans_of_an_item_potato_212_shows_from_a_list_are_left_out_and_named(tmp_path):
    config = bundle_project(tmp_path)
    data = config.data_files[0]
    data.write_text(json.dumps({"id": "i0", "text": ["turn one", "turn two"]}) + "\n", encoding="utf-8")
    info = build_bundle(config, ["entities"], tmp_path / "bundle", holdout_fraction=0.0)
    assert info.labeled == {"entities": 0}
    assert ("span answers of schema 'entities' on item(s) 'i0' were left out: Potato 2.12 shows those items from "
            "a list, a mapping or a displayed_text field, and their spans' offsets count that text, not the "
            "item's 'text'") in info.warnings


@pytest.mark.parametrize("schema", ["score", "summary"])
def test_schemas_without_labels_train_when_their_kind_needs_none(tmp_path, schema):
    config = bundle_project(tmp_path)
    info = build_bundle(config, [schema], tmp_path / "bundle", holdout_fraction=0.0)
    assert info.labeled == {schema: 1}
