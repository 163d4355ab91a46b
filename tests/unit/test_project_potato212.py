"""Items and labels the way Potato 2.12 reads them: data_directory, encodings, its split, its consensus."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import yaml

from potato.bundle.build import build_bundle, describe_bundle
from potato.bundle.holdout import split_of
from potato.config import load_config
from potato.items.read import read_items
from tests.support.potato_project import make_project, project_config, write_items, write_user_state


def _items(bundle: Path) -> list[dict]:
    return [json.loads(line) for line in (bundle / "items.jsonl").read_text().splitlines()]


def _directory_project(tmp_path: Path) -> Path:
    """A project whose items are in data_directory only, in every format 2.12 reads there."""
    make_project(tmp_path, n_items=0, annotators=("alice",), user_labels={"alice": {"d1": "positive", "c2": "negative"}})
    incoming = tmp_path / "incoming"
    write_items(incoming / "b.jsonl", [{"id": "b1", "text": "x"}, {"id": "b2", "text": "y"}])
    write_items(incoming / "a.json", [{"id": "a1", "text": "x"}], "array")
    write_items(incoming / "c.csv", [{"id": "c1", "text": "one, two"}, {"id": "c2", "text": "z"}], "csv")
    (incoming / "d.tsv").write_text('id\ttext\nd1\tsay "hi\n')
    (incoming / "notes.txt").write_text('{"id": "t1", "text": "not read"}\n')
    (incoming / ".hidden.jsonl").write_text('{"id": "h1", "text": "not read"}\n')
    (incoming / "UPPER.JSON").write_text('{"id": "u1", "text": "not read by 2.12 either"}\n')
    raw = yaml.safe_load((tmp_path / "config.yaml").read_text())
    del raw["data_files"]
    raw["data_directory"] = "incoming"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    return tmp_path / "config.yaml"


def test_data_directory_items_in_potato_212s_order(tmp_path):
    config = load_config(_directory_project(tmp_path))
    items = list(read_items(config))
    assert [i.id for i in items] == ["a1", "b1", "b2", "c1", "c2", "d1"]  # files sorted by path
    assert items[3].text == "one, two" and items[5].text == 'say "hi'  # TSV has no quoting


def test_a_data_directory_project_builds_a_bundle_of_all_its_items(tmp_path):
    config = load_config(_directory_project(tmp_path))
    info = build_bundle(config, ["sentiment"], tmp_path / "bundle", holdout_fraction=0.0)
    assert info.items == 6 and info.labeled == {"sentiment": 2}
    assert info.label_counts == {"sentiment": {"positive": 1, "negative": 1}}
    assert describe_bundle(info) == ("Bundle: 6 items from 1 annotator; sentiment: 2 labelled "
                                     "(positive 1, negative 1; 0 held out, 0 ties)")


def test_bad_records_in_a_data_directory_are_skipped_and_named(tmp_path):
    config = load_config(_directory_project(tmp_path))
    write_items(tmp_path / "incoming" / "e.jsonl", [
        {"id": "b1", "text": "a repeat of b.jsonl's"}, {"text": "no id"}, {"id": "e1"}, {"id": "e2", "text": "ok"}])
    info = build_bundle(config, ["sentiment"], tmp_path / "bundle")
    assert [i["id"] for i in _items(tmp_path / "bundle")][-2:] == ["e1", "e2"]
    assert {"id": "e1", "text": "", "labels": {}, "holdout": False} in _items(tmp_path / "bundle")
    assert sorted(info.warnings) == [
        "incoming/e.jsonl: item(s) 'b1' repeat an id read before; skipped (the first was kept)",
        "incoming/e.jsonl: item(s) 'e1' have no 'text' field; they train with an empty text",
        "incoming/e.jsonl: the item(s) at line(s) 2 have no 'id' field (item_properties.id_key); skipped",
    ]


def test_data_files_read_in_the_encoding_their_entry_names(tmp_path):
    config = project_config(make_project(tmp_path, n_items=1))
    path = config.data_files[0]
    path.write_bytes('{"id": "a", "text": "caf\u00e9"}\n'.encode("latin-1"))
    config = replace(config, data_file_encodings={path: "latin-1"})
    assert [i.text for i in read_items(config)] == ["caf\u00e9"]


def test_potato_212s_split_holds_out_its_test_items(tmp_path):
    config = project_config(make_project(tmp_path, n_items=80, labeled_fraction=1.0),
                            splits={"train": 0.6, "val": 0.2, "test": 0.2}, split_seed=5)
    info = build_bundle(config, ["sentiment"], tmp_path / "bundle")
    items = [i for i in _items(tmp_path / "bundle") if i["labels"]]
    held = {i["id"] for i in items if i["holdout"]}
    assert held == {i["id"] for i in items if split_of(i["id"], config.model_training.splits, 5) == "test"}
    assert 0 < len(held) == info.holdout["sentiment"] < len(items)
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert (manifest["splits"], manifest["split_seed"]) == ({"train": 0.6, "val": 0.2, "test": 0.2}, 5)


def test_split_of_is_potato_212s_partition():
    # Recorded from potato-annotation 2.12.1's publish.preprocessing._partition_splits
    # (tests/integration/test_potato212.py compares against the real one).
    splits = {"train": 0.8, "test": 0.2}
    assert [i for i in range(12) if split_of(f"r{i}", splits, 7) == "test"] == [3, 9]
    assert [split_of(f"r{i}", {"train": 0.7, "val": 0.15, "test": 0.15}, 0) for i in (4, 5, 6)] == [
        "train", "val", "train"]


def test_consensus_weighs_annotators_by_reliability(tmp_path):
    """alice and bob are right on every item; carol and dave always say positive.

    On the disputed item x only alice and carol answered, and they disagree:
    majority vote gives the tie to the first label (positive); Dawid-Skene
    (as Potato 2.12.1 does) follows alice, the reliable one. An item where a
    strict majority agrees is theirs either way (potato.annotations.consensus).
    """
    make_project(tmp_path, n_items=0, annotators=("alice",), user_labels={"alice": {}})
    items = [{"id": f"i{i}", "text": "t"} for i in range(12)] + [{"id": "x", "text": "t"}]
    write_items(tmp_path / "data" / "reviews.json", items)
    out = tmp_path / "annotation_output"
    truth = {f"i{i}": ("positive", "negative")[i % 2] for i in range(12)}
    for user in ("alice", "bob"):
        write_user_state(out, user, {i: {"sentiment": lab} for i, lab in truth.items()}
                         | ({"x": {"sentiment": "negative"}} if user == "alice" else {}))
    for user in ("carol", "dave"):
        write_user_state(out, user, {i: {"sentiment": "positive"} for i in list(truth) + (["x"] if user == "carol" else [])})

    def bundle(**model_training):
        config = project_config(tmp_path / "config.yaml", holdout_fraction=0.0, **model_training)
        info = build_bundle(config, ["sentiment"], tmp_path / "bundle")
        return info, next(i["labels"]["sentiment"] for i in _items(tmp_path / "bundle") if i["id"] == "x")

    assert bundle()[1] == "positive"
    info, label = bundle(aggregation="consensus")
    assert label == "negative"
    # The i-items with two right and two wrong answers are 2-2 ties too: Dawid-Skene gives them to alice and bob.
    assert describe_bundle(info) == (
        "Bundle: 13 items from 4 annotators; sentiment: 13 labelled (positive 6, negative 7; 0 held out, 0 ties); "
        "consensus (Dawid-Skene) labelled items otherwise than majority vote: 7 of sentiment")
