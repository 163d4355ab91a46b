"""potato.items.read and potato.bundle: items, labels as real Potato writes them, aggregation, holdout, the bundle."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import time
from pathlib import Path

import orjson
import pytest

from potato.annotations import labels
from potato.annotations.labels import aggregate_votes, read_votes
from potato.bundle import pack
from potato.bundle.build import build_bundle
from potato.bundle.holdout import holdout_flags, is_holdout, split_holdout
from potato.bundle.pack import pack_bundle
from potato.errors import ProjectDataError
from potato.items import read as items_read
from potato.items.read import read_items
from tests.support.potato_project import (
    make_project,
    project_config,
    user_state_dict,
    write_items,
    write_user_state,
)

SENTIMENT = ("positive", "negative")


def _config(tmp_path, **kw):
    kw.setdefault("n_items", 10)
    return project_config(make_project(tmp_path, **kw))


def _items(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _with_data(tmp_path, text: str, name: str = "reviews.json", **kw):
    """A project whose data file is replaced by *text* (verbatim)."""
    config = _config(tmp_path, **kw)
    data = tmp_path / "data" / name
    data.write_text(text, encoding="utf-8")
    return project_config(config.path) if name == "reviews.json" else _replace_data(config, data)


def _replace_data(config, data: Path):
    from dataclasses import replace

    return replace(config, data_files=(data,))


# --------------------------------------------------------------------------- items


@pytest.mark.parametrize("data_format", ["jsonl", "array", "csv", "tsv"])
def test_each_data_format_reads_ids_and_text_in_order(tmp_path, data_format):
    config = _config(tmp_path, n_items=5, data_format=data_format)
    items = list(read_items(config))
    assert [i.id for i in items] == ["r0", "r1", "r2", "r3", "r4"]
    assert items[1].text.startswith("Terrible")
    assert all(isinstance(i.id, str) for i in items)


def test_numeric_ids_become_strings(tmp_path):
    config = _with_data(tmp_path, '{"id": 7, "text": "a"}\n{"id": 8, "text": 42}\n')
    items = list(read_items(config))
    assert [(i.id, i.text) for i in items] == [("7", "a"), ("8", "42")]


def test_item_properties_keys_are_used(tmp_path):
    config = _config(tmp_path, n_items=3, id_key="doc_id", text_key="body")
    assert [i.id for i in read_items(config)] == ["r0", "r1", "r2"]


def test_json_array_elements_split_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(items_read, "_ARRAY_CHUNK", 7)
    text = '[\n  {"id": "a", "text": "x, y]"},\n  {"id": "b",\n   "text": "z"}, {"id": 3, "text": 1.5}\n]\n'
    config = _with_data(tmp_path, text)
    items = list(read_items(config))
    assert [(i.id, i.text, i.line) for i in items] == [("a", "x, y]", 2), ("b", "z", 3), ("3", "1.5", 4)]


def test_csv_quoted_newline_and_line_numbers(tmp_path):
    text = 'id,text\nr1,"two\nlines"\nr2,plain\n'
    config = _with_data(tmp_path, text, name="reviews.csv")
    items = list(read_items(config))
    assert [(i.id, i.text, i.line) for i in items] == [("r1", "two\nlines", 3), ("r2", "plain", 4)]


def test_blank_lines_in_json_lines_are_skipped(tmp_path):
    config = _with_data(tmp_path, '{"id": "a", "text": "x"}\n\n   \n{"id": "b", "text": "y"}\n')
    assert [(i.id, i.line) for i in read_items(config)] == [("a", 1), ("b", 4)]


def test_json_lines_orjson_refuses_read_as_python_reads_them(tmp_path):
    # NaN, a 70-bit integer and a lone \r (two lines in a text reader) are Python's JSON, not orjson's.
    text = ('{"id": "a", "text": "x", "score": NaN}\n{"id": 1180591620717411303424, "text": "y"}\n'
            '{"id": "c", "text": "z"}\r{"id": "d", "text": "w"}\n{"id": "e", "text": "v"}\n')
    config = _with_data(tmp_path, text)
    assert [(i.id, i.line) for i in read_items(config)] == [
        ("a", 1), ("1180591620717411303424", 2), ("c", 3), ("d", 4), ("e", 5)]


def test_malformed_json_line_names_file_and_line(tmp_path):
    lines = [json.dumps({"id": f"r{i}", "text": "ok"}) for i in range(16)] + ['{"id": "r16", "text": "oops}']
    config = _with_data(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(ProjectDataError, match=r"^data/reviews\.json line 17: not valid JSON: "):
        list(read_items(config))


def test_malformed_json_array_names_line(tmp_path):
    config = _with_data(tmp_path, '[\n {"id": "a", "text": "x"},\n {"id": "b" "text": "y"}\n]\n')
    with pytest.raises(ProjectDataError, match=r"^data/reviews\.json line 3: not valid JSON: "):
        list(read_items(config))


def test_unclosed_json_array(tmp_path):
    config = _with_data(tmp_path, '[{"id": "a", "text": "x"},\n')
    with pytest.raises(ProjectDataError, match=r"data/reviews\.json line 2: not valid JSON: the array is not closed"):
        list(read_items(config))


def test_missing_id_names_file_line_and_key(tmp_path):
    config = _with_data(tmp_path, '{"id": "a", "text": "x"}\n{"ident": "b", "text": "y"}\n')
    with pytest.raises(ProjectDataError) as err:
        list(read_items(config))
    assert str(err.value).startswith("data/reviews.json line 2: the item has no 'id' field (item_properties.id_key)")
    assert "'ident'" in str(err.value)


def test_missing_text_names_file_line_and_item(tmp_path):
    config = _with_data(tmp_path, '{"id": "a", "body": "x"}\n')
    with pytest.raises(ProjectDataError, match=r"^data/reviews\.json line 1: item 'a' has no 'text' field"):
        list(read_items(config))


def test_missing_text_column_in_csv(tmp_path):
    config = _with_data(tmp_path, "id,body\nr1,x\n", name="reviews.csv")
    with pytest.raises(ProjectDataError, match=r"^data/reviews\.csv line 2: item 'r1' has no 'text' field"):
        list(read_items(config))


def test_duplicate_id_in_one_file_names_both_lines(tmp_path):
    config = _with_data(tmp_path, '{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n{"id": "a", "text": "z"}\n')
    with pytest.raises(ProjectDataError) as err:
        list(read_items(config))
    assert str(err.value).startswith(
        "data/reviews.json line 3: duplicate item id 'a', first used at data/reviews.json line 1."
    )


def test_duplicate_id_across_files_names_both_files(tmp_path):
    from dataclasses import replace

    config = _config(tmp_path, n_items=3)
    extra = write_items(tmp_path / "data" / "more.csv", [{"id": "x1", "text": "a"}, {"id": "r2", "text": "b"}], "csv")
    config = replace(config, data_files=config.data_files + (extra,))
    with pytest.raises(ProjectDataError, match=r"^data/more\.csv line 3: duplicate item id 'r2', first used at data/reviews\.json line 3"):
        list(read_items(config))


def test_csv_row_with_extra_columns(tmp_path):
    config = _with_data(tmp_path, "id,text\nr1,a,b\n", name="reviews.csv")
    with pytest.raises(ProjectDataError, match=r"^data/reviews\.csv line 2: the row has more columns than the header"):
        list(read_items(config))


def test_data_file_not_utf8(tmp_path):
    config = _config(tmp_path)
    config.data_files[0].write_bytes('{"id": "a", "text": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(ProjectDataError, match=r"^data/reviews\.json: not UTF-8 text"):
        list(read_items(config))


def test_utf8_bom_is_accepted(tmp_path):
    config = _config(tmp_path)
    config.data_files[0].write_bytes(b"\xef\xbb\xbf" + b'{"id": "a", "text": "x"}\n')
    assert [i.id for i in read_items(config)] == ["a"]


def test_missing_data_file(tmp_path):
    from dataclasses import replace

    config = replace(_config(tmp_path), data_files=(tmp_path / "data" / "nope.json",))
    with pytest.raises(ProjectDataError, match=r"^data/nope\.json: cannot read the data file"):
        list(read_items(config))


# --------------------------------------------------------------------------- labels


def _scheme(config):
    return [config.scheme("sentiment")]


def test_both_user_state_formats_and_several_annotators(tmp_path):
    config = _config(tmp_path, n_items=4, user_labels={})
    out = config.output_annotation_dir
    write_user_state(out, "alice", {"r0": {"sentiment": "positive"}, "r1": {"sentiment": "negative"}}, "pairs")
    write_user_state(out, "bob", {"r0": {"sentiment": "positive"}, "r2": {"sentiment": "negative"}}, "dict")
    write_user_state(out, "carol", {"r1": {"sentiment": "positive"}}, "pairs", value=True)
    votes = read_votes(out, _scheme(config), config.task_dir)
    assert votes.users == ["alice", "bob", "carol"]
    assert votes.warnings == []
    assert votes.as_dict() == {
        "r0": {"sentiment": {"positive": 2}},
        "r1": {"sentiment": {"negative": 1, "positive": 1}},
        "r2": {"sentiment": {"negative": 1}},
    }
    assert votes.counts("sentiment", "r1") == [1, 1]


def test_real_potato_file_shape_is_read(tmp_path):
    """The exact shape of InMemoryUserState.to_json (indent=2, all top-level keys)."""
    state = user_state_dict("alice", {"r3": {"sentiment": "negative"}})
    assert state["instance_id_to_label_to_value"] == {"r3": [[{"schema": "sentiment", "name": "negative"}, "negative"]]}
    assert state["current_phase_and_page"] == ["annotation", "annotation"]
    config = _config(tmp_path, n_items=4, user_labels={"alice": {"r3": "negative"}})
    text = (config.output_annotation_dir / "alice" / "user_state.json").read_text()
    assert text.startswith('{\n  "user_id": "alice",\n  "instance_id_ordering": [')
    assert read_votes(config.output_annotation_dir, _scheme(config)).as_dict() == {"r3": {"sentiment": {"negative": 1}}}


@pytest.mark.parametrize("value", ["true", True, 1, "negative", "1"])
def test_selected_values(tmp_path, value):
    config = _config(tmp_path, n_items=2, user_labels={})
    write_user_state(config.output_annotation_dir, "u", {"r1": {"sentiment": "negative"}}, "pairs", value=value)
    assert read_votes(config.output_annotation_dir, _scheme(config)).as_dict() == {"r1": {"sentiment": {"negative": 1}}}


@pytest.mark.parametrize("value", ["false", False, 0, "", None])
def test_unselected_values_are_not_votes(tmp_path, value):
    config = _config(tmp_path, n_items=2, user_labels={})
    write_user_state(config.output_annotation_dir, "u", {"r1": {"sentiment": "negative"}}, "dict", value=value)
    assert read_votes(config.output_annotation_dir, _scheme(config)).as_dict() == {}


def test_other_schemas_and_spans_are_ignored(tmp_path):
    config = _config(tmp_path, n_items=2, user_labels={})
    path = write_user_state(config.output_annotation_dir, "u", {"r1": {"sentiment": "negative", "comment": "meh"}})
    state = json.loads(path.read_text())
    state["instance_id_to_span_to_value"] = {"r1": [[{"schema": "spans", "name": "x", "start": 0, "end": 2, "title": "x"}, "x"]]}
    path.write_text(json.dumps(state))
    votes = read_votes(config.output_annotation_dir, _scheme(config))
    assert votes.as_dict() == {"r1": {"sentiment": {"negative": 1}}} and votes.warnings == []


def test_directory_without_user_state_is_not_a_user(tmp_path):
    config = _config(tmp_path, n_items=4)
    (config.output_annotation_dir / "training" / "runs").mkdir(parents=True)
    (config.output_annotation_dir / "notes.txt").write_text("hi")
    votes = read_votes(config.output_annotation_dir, _scheme(config))
    assert votes.users == ["alice", "bob", "carol"]


def test_unknown_label_warns_with_file_item_schema_label_and_is_skipped(tmp_path):
    config = _config(tmp_path, n_items=3, user_labels={})
    write_user_state(config.output_annotation_dir, "dave", {"r2": {"sentiment": "neutral"}, "r1": {"sentiment": "positive"}})
    votes = read_votes(config.output_annotation_dir, _scheme(config), config.task_dir)
    assert votes.as_dict() == {"r1": {"sentiment": {"positive": 1}}}
    assert votes.skipped_annotations == 1
    (warning,) = votes.warnings
    assert warning.startswith(
        "annotation_output/dave/user_state.json: item(s) 'r2' have label 'neutral' for schema 'sentiment', "
        "which is not one of its labels ['positive', 'negative']; those annotations were skipped."
    )


def test_unknown_label_on_many_items_is_one_warning(tmp_path):
    config = _config(tmp_path, n_items=3, user_labels={})
    write_user_state(config.output_annotation_dir, "dave", {f"r{i}": {"sentiment": "neutral"} for i in range(50)})
    votes = read_votes(config.output_annotation_dir, _scheme(config), config.task_dir)
    (warning,) = votes.warnings
    assert "'r0', 'r1', 'r2', 'r3', 'r4' and 45 more have label 'neutral'" in warning


def test_unparseable_user_state_is_reported_skipped_and_left_byte_identical(tmp_path):
    config = _config(tmp_path, n_items=6)
    broken = config.output_annotation_dir / "bob" / "user_state.json"
    content = broken.read_bytes()[:-40]  # cut mid-write, as a crash would leave it
    broken.write_bytes(content)
    os.chmod(broken, 0o444)
    before = (broken.read_bytes(), os.stat(broken).st_mtime_ns)
    info = build_bundle(config, ["sentiment"], tmp_path / "bundle")
    assert (broken.read_bytes(), os.stat(broken).st_mtime_ns) == before
    assert info.users == ("alice", "carol")
    (warning,) = [w for w in info.warnings if "bob" in w]
    assert warning.startswith("annotation_output/bob/user_state.json: skipped, not valid JSON: the file ends early at line ")
    # nothing of the broken file counts, not even the entries before the cut
    without_bob = read_votes(config.output_annotation_dir, _scheme(config))
    os.chmod(broken, 0o644)
    broken.unlink()
    assert without_bob.as_dict() == read_votes(config.output_annotation_dir, _scheme(config)).as_dict()


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "expected a JSON object at the top, found nothing"),
        ("[1, 2]", "expected a JSON object at the top, found list"),
        ('{"user_id": "x", "instance_id_to_label_to_value": {"r1": [}', "not valid JSON: Expecting value at line 1"),
        ('{"instance_id_to_label_to_value": {}} {}', "not valid JSON: extra data after the object at line 1"),
    ],
)
def test_unreadable_user_state_reasons(tmp_path, text, reason):
    (tmp_path / "eve").mkdir()
    (tmp_path / "eve" / "user_state.json").write_text(text)
    votes = read_votes(tmp_path, [project_config(make_project(tmp_path / "p", n_items=1)).scheme("sentiment")], tmp_path)
    assert votes.warnings == [f"eve/user_state.json: skipped, {reason}"]
    assert votes.users == []


@pytest.mark.parametrize("indent", [2, None])
def test_user_state_streaming_matches_a_whole_parse(tmp_path, monkeypatch, indent):
    config = _config(tmp_path, n_items=60, fmt=["pairs", "dict", "pairs"], indent=indent)
    whole = read_votes(config.output_annotation_dir, _scheme(config)).as_dict()
    monkeypatch.setattr(labels, "_USER_STATE_CHUNK", 3)
    monkeypatch.setattr(labels, "_USER_STATE_WINDOW", 16)
    assert read_votes(config.output_annotation_dir, _scheme(config)).as_dict() == whole
    expected: dict = {}
    for user in ("alice", "bob", "carol"):
        state = json.loads((config.output_annotation_dir / user / "user_state.json").read_text())
        for item_id, entry in state["instance_id_to_label_to_value"].items():
            for schema, label, _ in labels.parse_label_entries(entry):
                counts = expected.setdefault(item_id, {}).setdefault(schema, {})
                counts[label] = counts.get(label, 0) + 1
    assert whole == expected


def test_user_state_the_fast_reader_gives_up_on_is_read_carefully(tmp_path):
    # NaN is not JSON, but Python's json (and so the careful reader) reads it: the votes count.
    config = _config(tmp_path, n_items=3, user_labels={"alice": {"r0": "positive", "r1": "negative"}})
    path = config.output_annotation_dir / "alice" / "user_state.json"
    path.write_text(path.read_text().replace('"current_instance_index": 1', '"current_instance_index": NaN'))
    assert "NaN" in path.read_text()
    votes = read_votes(config.output_annotation_dir, _scheme(config), config.task_dir)
    assert votes.warnings == []
    assert votes.as_dict() == {"r0": {"sentiment": {"positive": 1}}, "r1": {"sentiment": {"negative": 1}}}


def test_user_state_of_wrong_shape_is_skipped(tmp_path):
    config = _config(tmp_path, n_items=3, user_labels={})
    (config.output_annotation_dir / "eve").mkdir()
    (config.output_annotation_dir / "eve" / "user_state.json").write_text('{"instance_id_to_label_to_value": [1, 2]}')
    votes = read_votes(config.output_annotation_dir, _scheme(config), config.task_dir)
    assert "eve" not in votes.users
    assert votes.warnings == [
        "annotation_output/eve/user_state.json: skipped, instance_id_to_label_to_value is a list, not an object"
    ]


def test_malformed_item_entry_is_skipped_with_warning(tmp_path):
    config = _config(tmp_path, n_items=3, user_labels={})
    path = config.output_annotation_dir / "eve" / "user_state.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"instance_id_to_label_to_value": {"r1": [["sentiment", "positive"]], "r2": {"sentiment": {"negative": "true"}}}}))
    votes = read_votes(config.output_annotation_dir, _scheme(config), config.task_dir)
    assert votes.as_dict() == {"r2": {"sentiment": {"negative": 1}}}
    assert len(votes.warnings) == 1 and "item(s) 'r1' skipped: expected" in votes.warnings[0]


def test_labels_for_items_not_in_data_are_counted_and_reported_once(tmp_path):
    config = _config(tmp_path, n_items=3, user_labels={"alice": {"r1": "positive", "gone1": "negative", "gone2": "positive"}})
    info = build_bundle(config, ["sentiment"], tmp_path / "bundle")
    assert info.unknown_item_labels == 2
    assert info.warnings == ("annotation_output/alice/user_state.json: 2 labels by alice on 2 ids that are not items "
                             "of this project were ignored: 'gone1', 'gone2'",)


PLANTED = "\ud83d"  # what one POST to Potato 2.12's /submit_annotation can leave in a user_state.json
LONG_ID = "x" * 200_000


@pytest.mark.parametrize("aggregation", ["majority", "consensus"])
def test_labels_an_annotator_planted_on_ids_that_are_not_items_are_ignored_and_named_short(tmp_path, aggregation):
    config = _config(tmp_path, n_items=6, model_training={"aggregation": aggregation},
                     user_labels={"alice": {"r0": "positive", "r1": "negative"}, "bob": {"r0": "positive"}})
    path = config.output_annotation_dir / "mallory" / "user_state.json"
    path.parent.mkdir()
    pair = lambda label: [{"schema": "sentiment", "name": label}, label]  # noqa: E731
    path.write_text(json.dumps({"instance_id_to_label_to_value": {
        PLANTED: [pair("positive")], LONG_ID: [pair("positive"), pair("negative")], "r1": [pair("negative")]}}))
    info = build_bundle(config, ["sentiment"], tmp_path / "bundle")
    assert info.warnings == (
        "annotation_output/mallory/user_state.json: 3 labels by mallory on 2 ids that are not items of this project "
        "were ignored: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…' (200000 "
        "characters), '\\ud83d'",)
    assert info.unknown_item_labels == 2 and info.users == ("alice", "bob", "carol", "mallory")
    items = _items(tmp_path / "bundle" / "items.jsonl")
    assert [i["id"] for i in items] == [f"r{i}" for i in range(6)]
    assert {i["id"]: i["labels"] for i in items if i["labels"]} == {"r0": {"sentiment": "positive"},
                                                                    "r1": {"sentiment": "negative"}}


def test_five_two_megabyte_ids_make_one_short_warning(tmp_path):
    config = _config(tmp_path, n_items=3, annotators=("mallory",),
                     user_labels={"mallory": {str(k) * 2_000_000: "positive" for k in range(5)}})
    (warning,) = build_bundle(config, ["sentiment"], tmp_path / "bundle").warnings
    assert len(warning) < 700 and warning.endswith("'44444444444444444444444444444444444444444444444444444444444444444444"
                                                   "444444444444…' (2000000 characters)")


def test_one_label_on_one_id_that_is_not_an_item_is_worded_in_the_singular(tmp_path):
    config = _config(tmp_path, n_items=3, annotators=("mallory",), user_labels={"mallory": {"gone": "negative"}})
    assert build_bundle(config, ["sentiment"], tmp_path / "bundle").warnings == (
        "annotation_output/mallory/user_state.json: 1 label by mallory on 1 id that is not an item of this project "
        "was ignored: 'gone'",)


@pytest.mark.parametrize("data_format", ["jsonl", "array"])
def test_an_item_id_utf8_cannot_encode_is_refused_naming_file_and_line(tmp_path, data_format):
    config = _config(tmp_path, n_items=3, data_format=data_format)
    items = [{"id": "r0", "text": "fine"}, {"id": PLANTED, "text": "a lone surrogate for an id"}]
    lines = [json.dumps(item) for item in items]  # the escape, \\ud83d, is what such a file holds
    config.data_files[0].write_text("\n".join(lines) if data_format == "jsonl" else "[\n" + ",\n".join(lines) + "\n]")
    with pytest.raises(ProjectDataError) as caught:
        build_bundle(config, ["sentiment"], tmp_path / "bundle")
    line = 2 if data_format == "jsonl" else 3
    assert str(caught.value) == (
        f"data/reviews.json line {line}: item id '\\ud83d' holds a lone surrogate (an escape such as \\ud83d "
        "without its pair), which UTF-8 cannot encode; change the id in the data file")


# --------------------------------------------------------------------------- aggregation


def test_majority_wins_and_ties_go_to_the_first_label_in_schema_order(tmp_path):
    config = _config(
        tmp_path,
        n_items=4,
        annotators=("a", "b", "c", "d"),
        user_labels={
            "a": {"r0": "negative", "r1": "negative", "r2": "negative"},
            "b": {"r0": "negative", "r1": "positive", "r2": "positive"},
            "c": {"r0": "positive", "r3": "negative"},
            # d is read last: the tie on r1 must not depend on reading order
            "d": {},
        },
    )
    votes = read_votes(config.output_annotation_dir, _scheme(config))
    agg = aggregate_votes(votes)
    assert agg.labels_of("r1") == {"sentiment": "positive"}
    assert agg.as_dict() == {
        "r0": {"sentiment": "negative"},
        "r1": {"sentiment": "positive"},
        "r2": {"sentiment": "positive"},
        "r3": {"sentiment": "negative"},
    }
    assert agg.ties == {"sentiment": 2}


def test_tie_break_follows_schema_label_order_not_vote_order(tmp_path):
    from potato.config import Scheme

    schemes = [Scheme("s", "radio", ("c", "b", "a"))]
    for order in (["u1", "u2"], ["u2", "u1"]):
        out = tmp_path / "-".join(order)
        write_user_state(out, order[0], {"x": {"s": "a"}, "y": {"s": "a"}})
        write_user_state(out, order[1], {"x": {"s": "b"}, "y": {"s": "a"}})
        agg = aggregate_votes(read_votes(out, schemes))
        assert agg.as_dict() == {"x": {"s": "b"}, "y": {"s": "a"}}
        assert agg.ties == {"s": 1}


def test_multiselect_votes_each_selected_label(tmp_path):
    from potato.config import Scheme

    schemes = [Scheme("topics", "multiselect", ("price", "quality", "shipping"))]
    write_user_state(tmp_path, "u1", {"x": {"topics": ["quality", "shipping"]}})
    write_user_state(tmp_path, "u2", {"x": {"topics": ["shipping"]}}, "dict")
    votes = read_votes(tmp_path, schemes)
    assert votes.counts("topics", "x") == [0, 1, 2]
    assert aggregate_votes(votes).as_dict() == {"x": {"topics": "shipping"}}


# --------------------------------------------------------------------------- holdout


def test_holdout_is_sha256_of_the_id():
    digest = hashlib.sha256(b"r42").digest()
    expected = int.from_bytes(digest[:8], "big") / 2**64 < 0.2
    assert is_holdout("r42", 0.2) is expected


def test_holdout_same_ids_any_order_same_split():
    ids = [f"item-{i}" for i in range(2000)]
    assert split_holdout(ids, 0.2) == split_holdout(list(reversed(ids)), 0.2)
    # independent of other items: each id decides alone
    assert split_holdout(ids[:100], 0.2) == split_holdout(ids, 0.2) & set(ids[:100])


def test_holdout_fraction_is_roughly_right_on_10k_ids():
    ids = [f"r{i}" for i in range(10_000)]
    for fraction in (0.1, 0.2, 0.5):
        n = len(split_holdout(ids, fraction))
        assert abs(n / 10_000 - fraction) < 0.02
    assert split_holdout(ids, 0.0) == set()
    assert split_holdout(ids, 0.1) <= split_holdout(ids, 0.2)  # growing the fraction only adds


def test_holdout_only_over_labelled_items_and_configurable(tmp_path):
    config = project_config(make_project(tmp_path, n_items=200), holdout_fraction=0.5)
    info = build_bundle(config, ["sentiment"], tmp_path / "bundle")
    items = _items(tmp_path / "bundle" / "items.jsonl")
    assert not any(i["holdout"] for i in items if not i["labels"])
    held = [i for i in items if i["holdout"]]
    assert info.holdout["sentiment"] == len(held)
    assert 0.3 < len(held) / info.labeled["sentiment"] < 0.7
    assert all(is_holdout(i["id"], 0.5) for i in held)


# --------------------------------------------------------------------------- bundle


def test_bundle_contents(tmp_path):
    config = _config(
        tmp_path,
        n_items=5,
        user_labels={"alice": {"r0": "positive", "r1": "negative", "r3": "positive"}, "bob": {"r3": "negative"}},
    )
    info = build_bundle(config, ["sentiment"], tmp_path / "bundle", holdout_fraction=0.0)
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest == {
        "format": 1,
        "schemas": {"sentiment": ["positive", "negative"]},
        "answers": {"sentiment": {"type": "radio", "kind": "nominal", "description": "Is this review positive or negative?"}},
        "id_key": "id",
        "text_key": "text",
        "holdout_fraction": 0.0,
        "aggregation": "majority",
        "counts": {"items": 5, "labeled": {"sentiment": 3}, "holdout": {"sentiment": 0}, "ties": {"sentiment": 1},
                   "labels": {"sentiment": {"positive": 2, "negative": 1}}},
    }
    items = _items(tmp_path / "bundle" / "items.jsonl")
    assert [i["id"] for i in items] == ["r0", "r1", "r2", "r3", "r4"]
    assert items[0] == {"id": "r0", "text": items[0]["text"], "labels": {"sentiment": "positive"}, "holdout": False}
    assert items[2]["labels"] == {} and items[3]["labels"] == {"sentiment": "positive"}
    assert "fields" not in items[0]
    assert sorted(p.name for p in (tmp_path / "bundle").iterdir()) == ["items.jsonl", "manifest.json"]
    assert (info.items, info.labeled, info.ties, info.users) == (5, {"sentiment": 3}, {"sentiment": 1}, ("alice", "bob", "carol"))


def test_bundle_unknown_schema(tmp_path):
    config = _config(tmp_path)
    with pytest.raises(ProjectDataError, match=r"no annotation scheme named 'topic'; the config has \['sentiment'\]"):
        build_bundle(config, ["topic"], tmp_path / "bundle")


def test_bundle_without_annotation_dir_has_no_labels(tmp_path):
    import shutil

    config = _config(tmp_path, n_items=3)
    shutil.rmtree(config.output_annotation_dir)
    info = build_bundle(config, ["sentiment"], tmp_path / "bundle")
    assert info.labeled == {"sentiment": 0} and info.users == ()


def _pack(tmp_path, config, name):
    bundle = tmp_path / f"bundle-{name}"
    build_bundle(config, ["sentiment"], bundle)
    return pack_bundle(bundle, tmp_path / f"{name}.tar.gz")


def test_concurrent_packs_of_one_bundle_do_not_collide(tmp_path):
    """The flow and an agent's claim may pack the same bundle at once."""
    import threading

    config = project_config(make_project(tmp_path / "proj", n_items=300))
    bundle = tmp_path / "bundle"
    build_bundle(config, ["sentiment"], bundle)
    expected = pack_bundle(bundle, tmp_path / "alone.tar.gz").read_bytes()
    dest = tmp_path / "bundle.tar.gz"
    failures = []

    def pack():
        try:
            for _ in range(15):
                pack_bundle(bundle, dest)
        except Exception as exc:  # noqa: BLE001 - collected, asserted below
            failures.append(exc)

    threads = [threading.Thread(target=pack) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert dest.read_bytes() == expected
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".bundle")) == []


def test_pack_is_deterministic_and_relative(tmp_path):
    (tmp_path / "proj" / "img").mkdir(parents=True)
    (tmp_path / "proj" / "img" / "a.png").write_bytes(b"\x89PNG fake")
    config_path = make_project(tmp_path / "proj", n_items=30)
    data = tmp_path / "proj" / "data" / "reviews.json"
    data.write_text(data.read_text().replace('"text"', '"image": "img/a.png", "text"', 1))
    config = project_config(config_path)
    first = _pack(tmp_path, config, "one")
    os.utime(tmp_path / "bundle-one" / "items.jsonl", (1, 1))
    second = _pack(tmp_path, config, "two")
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() == pack_bundle(tmp_path / "bundle-one", tmp_path / "again.tar.gz").read_bytes()
    with tarfile.open(first) as tar:
        names = tar.getnames()
        assert names == ["items.jsonl", "manifest.json", "media", "media/img", "media/img/a.png"]
        assert {m.mtime for m in tar.getmembers()} == {pack._PACK_MTIME}
        assert tar.extractfile("media/img/a.png").read() == b"\x89PNG fake"
        assert tar.extractfile("items.jsonl").read() == (tmp_path / "bundle-one" / "items.jsonl").read_bytes()


# --------------------------------------------------------------------------- media


def _media_project(tmp_path, value: str):
    config = _config(tmp_path / "proj", n_items=3)
    data = config.data_files[0]
    lines = data.read_text().splitlines()
    record = json.loads(lines[1])
    record["image"] = value
    lines[1] = json.dumps(record)
    data.write_text("\n".join(lines) + "\n")
    return config


def test_media_files_are_copied_with_relative_paths(tmp_path):
    config = _media_project(tmp_path, "media_in/x/photo.JPG")
    (config.task_dir / "media_in" / "x").mkdir(parents=True)
    (config.task_dir / "media_in" / "x" / "photo.JPG").write_bytes(b"jpeg")
    info = build_bundle(config, ["sentiment"], tmp_path / "bundle")
    assert (tmp_path / "bundle" / "media" / "media_in" / "x" / "photo.JPG").read_bytes() == b"jpeg"
    items = _items(tmp_path / "bundle" / "items.jsonl")
    assert items[1]["fields"] == {"image": "media_in/x/photo.JPG"}
    assert info.media_files == 1


@pytest.mark.parametrize("value", ["../secret.png", "imgs/../../secret.png"])
def test_media_path_traversal_is_rejected(tmp_path, value):
    (tmp_path / "proj").mkdir()
    (tmp_path / "secret.png").write_bytes(b"private")
    config = _media_project(tmp_path, value)
    with pytest.raises(ProjectDataError) as err:
        build_bundle(config, ["sentiment"], tmp_path / "bundle")
    assert str(err.value).startswith(f"data/reviews.json line 2: field 'image' of item 'r1' names a media file outside task_dir: {value!r}")
    assert not (tmp_path / "bundle" / "media").exists()


def test_media_absolute_path_outside_and_symlink_escape_are_rejected(tmp_path):
    (tmp_path / "proj").mkdir()
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"private")
    config = _media_project(tmp_path, str(secret))
    with pytest.raises(ProjectDataError, match="outside task_dir"):
        build_bundle(config, ["sentiment"], tmp_path / "bundle")
    link = tmp_path / "proj" / "link.png"
    link.symlink_to(secret)
    config = _media_project(tmp_path, "link.png")
    with pytest.raises(ProjectDataError, match="outside task_dir"):
        build_bundle(config, ["sentiment"], tmp_path / "bundle2")


def test_missing_media_and_urls(tmp_path):
    config = _media_project(tmp_path, "nowhere/x.png")
    info = build_bundle(config, ["sentiment"], tmp_path / "bundle")
    assert any("field 'image' of item(s) 'r1' names a media file that does not exist" in w for w in info.warnings)
    config = _media_project(tmp_path, "https://example.org/x.png")
    info = build_bundle(config, ["sentiment"], tmp_path / "bundle2")
    assert info.warnings == () and info.media_files == 0


# --------------------------------------------------------------------------- fast paths
# Blocks written in C-level passes, distinct label entries interpreted once,
# annotators' files parsed in forked children: each must give exactly what the
# plain way gives, or step aside for it.


_ODD_LINES = [
    '{"id": "a1", "text": "plain"}',
    "",
    '{"id": "a2", "text": "x", "score": NaN}',
    '{"id": "a3", "text": "crlf"}\r',
    '{"id": "a4",\r"text": "a lone CR"}',
    '{"id": 5, "text": "an int id"}',
    '{"id": 12345678901234567890123, "text": "a big int id"}',
    '{"id": "a6", "text": 1.5}',
    '{"id": "a7", "text": "caf\\u00e9 \\u2713"}',
    '{"id": "a8", "text": "lone \\ud800 surrogate"}',
    '{"id": "a9", "text": "see photo.p\\u006eg"}',
    '{"id": "a10", "text": "see clip.m\u212av"}',
    '{"id": "a11", "text": "see img/a.png", "image": "img/a.png"}',
    '{"id": "a12", "text": "quote \\" and backslash \\\\"}',
]


def test_blocks_write_what_the_line_by_line_way_writes(tmp_path, monkeypatch):
    config = _config(tmp_path, n_items=0, user_labels={"alice": {"a1": "positive", "a7": "negative", "a9": "positive"}})
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(b"png")
    lines = [json.dumps({"id": f"r{i}", "text": f"review {i}"}) for i in range(300)]
    for i, odd in enumerate(_ODD_LINES):
        lines.insert(i * 20, odd)
    config.data_files[0].write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    results = []
    for block, clean in [(1 << 20, True), (64, True), (1 << 20, False)]:
        monkeypatch.setattr(items_read, "_LINES_BLOCK", block)
        if not clean:  # every block goes line by line, as before blocks existed
            monkeypatch.setattr(items_read, "_clean_block", lambda *a: None)
        dest = tmp_path / f"bundle-{block}-{clean}"
        info = build_bundle(config, ["sentiment"], dest)
        results.append(((dest / "items.jsonl").read_bytes(), info.items, info.labeled, info.warnings, info.media_files))
    assert results[0] == results[1] == results[2]
    assert results[0][1] == 300 + len(_ODD_LINES) - 1  # the blank line is no item


@pytest.mark.parametrize("block", [32, 1 << 20])
def test_a_repeat_in_a_later_block_names_both_lines(tmp_path, monkeypatch, block):
    monkeypatch.setattr(items_read, "_LINES_BLOCK", block)
    lines = [json.dumps({"id": f"r{i}", "text": "x"}) for i in range(40)] + [json.dumps({"id": "r3", "text": "y"})]
    config = _with_data(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(ProjectDataError, match=r"^data/reviews\.json line 41: duplicate item id 'r3', first used at "
                                                r"data/reviews\.json line 4\."):
        build_bundle(config, ["sentiment"], tmp_path / "bundle")


def test_every_media_name_is_noticed_in_a_block():
    # looks_like_media decides on the decoded string; the block's hint sees only its JSON text.
    rng = __import__("random").Random(7)
    exts = sorted(items_read.MEDIA_EXTENSIONS) + [".txt", ".pn", ".jpegg"]
    for _ in range(3000):
        stem = "".join(rng.choice("ab./\\\"é \u212a") for _ in range(rng.randint(0, 6)))
        ext = rng.choice(exts)
        ext = "".join(c.upper() if rng.random() < 0.3 else c for c in ext).replace("K", rng.choice("K\u212a"))
        value = stem + ext
        for text in (orjson.dumps({"f": value}), json.dumps({"f": value}).encode(),
                     json.dumps({"f": value}).replace(".", "\\u002e").encode()):
            if items_read.looks_like_media(value):
                assert items_read._may_name_media(text), (value, text)
    assert not items_read._may_name_media(b'{"id": "r1", "text": "Great product. (review 1)"}')


@pytest.mark.parametrize("fraction", [0.0, 1e-12, 0.2, 0.5, 1 - 2**-53, 1.0, 1.5, float("nan"), float("inf")])
def test_holdout_flags_are_is_holdout(fraction):
    ids = [f"item-{i}" for i in range(3000)] + ["", "é", "\u212a" * 40]
    assert holdout_flags(ids, fraction) == [is_holdout(i, fraction) for i in ids]


def test_two_schemas_in_one_bundle(tmp_path):
    from dataclasses import replace

    from potato.config import Scheme

    config = _config(tmp_path, n_items=4, user_labels={})
    config = replace(config, schemes=config.schemes + (Scheme("topic", "multiselect", ("price", "quality")),))
    write_user_state(config.output_annotation_dir, "u1", {"r0": {"sentiment": "negative", "topic": ["quality"]},
                                                          "r1": {"topic": ["price", "quality"]}, "r2": {"sentiment": "positive"}})
    info = build_bundle(config, ["sentiment", "topic"], tmp_path / "bundle", holdout_fraction=0.0)
    items = _items(tmp_path / "bundle" / "items.jsonl")
    # One annotator: their ticked set is the item's, and an item they saved without ticking has none.
    assert [i["labels"] for i in items] == [{"sentiment": "negative", "topic": ["quality"]},
                                            {"topic": ["price", "quality"]}, {"sentiment": "positive", "topic": []}, {}]
    assert info.labeled == {"sentiment": 2, "topic": 3} and info.ties == {"sentiment": 0, "topic": 0}
    assert info.label_counts == {"sentiment": {"positive": 1, "negative": 1}, "topic": {"price": 1, "quality": 2}}


@pytest.mark.parametrize("consensus", [False, True])
def test_a_file_broken_after_many_batches_takes_its_votes_back(tmp_path, monkeypatch, consensus):
    config = _config(tmp_path, n_items=200, model_training={"aggregation": "consensus"} if consensus else None)
    broken = config.output_annotation_dir / "bob" / "user_state.json"
    text = broken.read_text()
    cut = text.index('"instance_id_to_span_to_value"')
    broken.write_text(text[:cut] + "oops" + text[cut:])  # valid up to the end of the labels
    monkeypatch.setattr(labels, "_USER_STATE_WINDOW", 64)  # many batches are counted before the break
    with_broken = read_votes(config.output_annotation_dir, _scheme(config), per_user=consensus)
    assert with_broken.users == ["alice", "carol"]
    broken.unlink()
    without = read_votes(config.output_annotation_dir, _scheme(config), per_user=consensus)
    assert with_broken.votes == without.votes and with_broken.by_user == without.by_user


def _forking(monkeypatch) -> list:
    """Make read_votes fork for every file; returns the children it starts."""
    started = []

    class Counted(labels.Forked):
        def __init__(self, *args):
            super().__init__(*args)
            started.append(self.pid)

    monkeypatch.setattr(labels, "_FORK_MIN_BYTES", 0)
    monkeypatch.setattr(labels, "_cpu_to_spare", lambda: True)
    monkeypatch.setattr(labels, "Forked", Counted)
    return started


@pytest.mark.skipif(not labels.can_fork(), reason="forks only on Linux")
def test_files_parsed_in_children_count_as_files_parsed_here(tmp_path, monkeypatch):
    config = _config(tmp_path, n_items=60, annotators=("a", "b", "c", "d", "e"), fmt=["pairs", "dict", "pairs", "dict", "pairs"])
    write_user_state(config.output_annotation_dir, "f", {"r1": {"sentiment": "neutral"}, "r2": {"sentiment": "positive"}})
    cut = config.output_annotation_dir / "c" / "user_state.json"
    cut.write_bytes(cut.read_bytes()[:-40])
    here = build_bundle(config, ["sentiment"], tmp_path / "here")
    started = _forking(monkeypatch)
    forked = build_bundle(config, ["sentiment"], tmp_path / "forked")
    assert len(started) == 6
    assert (tmp_path / "here" / "items.jsonl").read_bytes() == (tmp_path / "forked" / "items.jsonl").read_bytes()
    assert (forked.users, forked.warnings, forked.skipped_annotations) == (here.users, here.warnings, here.skipped_annotations)
    assert any(w.startswith("annotation_output/c/user_state.json: skipped, not valid JSON") for w in forked.warnings)


@pytest.mark.skipif(not labels.can_fork(), reason="forks only on Linux")
def test_a_child_that_fails_leaves_the_file_to_this_process(tmp_path, monkeypatch):
    config = _config(tmp_path, n_items=30)
    expected = read_votes(config.output_annotation_dir, _scheme(config))
    started = _forking(monkeypatch)
    monkeypatch.setattr(labels, "_parsed_members", lambda path, members: os.kill(os.getpid(), 9))
    votes = read_votes(config.output_annotation_dir, _scheme(config))
    assert len(started) == 3 and (votes.votes, votes.users) == (expected.votes, expected.users)


@pytest.mark.skipif(not labels.can_fork(), reason="forks only on Linux")
def test_no_child_outlives_a_failed_count(tmp_path, monkeypatch):
    config = _config(tmp_path, n_items=30, annotators=("a", "b", "c", "d"))
    started = _forking(monkeypatch)
    parse = labels._parsed_members
    # The first file parses; the children of the others are still at work when counting it fails.
    monkeypatch.setattr(labels, "_parsed_members",
                        lambda path, members: parse(path, members) if path.parent.name == "a" else time.sleep(60))
    monkeypatch.setattr(labels, "_tally_votes", lambda *a: 1 / 0)
    t0 = time.monotonic()
    with pytest.raises(ZeroDivisionError):
        read_votes(config.output_annotation_dir, _scheme(config))
    assert len(started) >= 2 and time.monotonic() - t0 < 30
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
