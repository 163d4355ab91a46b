"""Writeback: Potato 2.12's predictions_file shape, the leak guard, every rule counted."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from potato.bundle.build import build_bundle
from potato.bundle.holdout import is_holdout
from potato.config import WritebackConfig
from potato.results.writeback import WritebackError, write_back, writeback_path
from tests.support.potato_project import project_config, write_items, write_user_state

# Items r0..r9; r0..r5 are labelled. Half of the labelled ones are held out (by id).
FRACTION = 0.6
LABELLED = [f"r{i}" for i in range(6)]
HELD = [i for i in LABELLED if is_holdout(i, FRACTION)]
TRAINED = [i for i in LABELLED if not is_holdout(i, FRACTION)]
UNLABELLED = [f"r{i}" for i in range(6, 10)]


def _project(tmp_path: Path, trained=("sentiment", "topic"), **writeback):
    """A two-schema project, the bundle of a run that trained *trained*, and the config with *writeback*."""
    write_items(tmp_path / "data" / "items.jsonl", [{"id": f"r{i}", "text": f"text {i}"} for i in range(10)])
    labels = {i: {"sentiment": "positive" if n % 2 else "negative", "topic": "books"} for n, i in enumerate(LABELLED)}
    write_user_state(tmp_path / "annotation_output", "alice", labels)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "task_dir": ".", "data_files": ["data/items.jsonl"], "output_annotation_dir": "annotation_output",
        "annotation_schemes": [
            {"annotation_type": "radio", "name": "sentiment", "labels": ["positive", "negative"]},
            {"annotation_type": "radio", "name": "topic", "labels": ["books", "music"]}],
    }))
    config = project_config(tmp_path / "config.yaml", holdout_fraction=FRACTION)
    mt = replace(config.model_training, writeback=WritebackConfig(**writeback))
    config = replace(config, model_training=mt)
    build_bundle(config, list(trained), tmp_path / "bundle")
    return config


def _predict(path: Path, ids, schema="sentiment", label="positive", confidence=0.9) -> list[dict]:
    return [{"id": i, "schema": schema, "label": label, "confidence": confidence} for i in ids]


def _write(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _written(config) -> dict[str, dict]:
    records = [json.loads(line) for line in writeback_path(config).read_text().splitlines()]
    assert all(set(r) == {"id", config.model_training.writeback.field} for r in records)  # 2.12's shape
    return {r["id"]: r[config.model_training.writeback.field] for r in records}


def test_one_record_per_item_in_the_shape_potato_212_reads(tmp_path):
    config = _project(tmp_path, schemas=("sentiment", "topic"), include_unlabeled=True, field="model")
    predictions = _write(tmp_path / "p.jsonl", _predict(tmp_path, ["r8", "r9"])
                         + _predict(tmp_path, ["r8"], "topic", "music", 0.75))
    write_back(config, 7, ["sentiment", "topic"], predictions, tmp_path / "bundle")
    assert _written(config) == {
        "r8": {"sentiment": {"label": "positive", "confidence": 0.9, "run_id": 7},
               "topic": {"label": "music", "confidence": 0.75, "run_id": 7}},
        "r9": {"sentiment": {"label": "positive", "confidence": 0.9, "run_id": 7}},
    }


def test_the_leak_guard_and_every_rule_hold_back_with_a_count(tmp_path):
    assert TRAINED and HELD  # the fixture needs both kinds
    config = _project(tmp_path, schemas=("sentiment",), include_unlabeled=False, min_confidence=0.6)
    rows = (_predict(tmp_path, LABELLED + UNLABELLED)          # the run predicts every item
            + _predict(tmp_path, ["nope"])                      # not an item of the project
            + _predict(tmp_path, HELD[:1], confidence=0.8)      # a second prediction for one item
            + _predict(tmp_path, ["r1"], "topic", "books"))     # a schema not written back
    rows[LABELLED.index(HELD[-1])]["confidence"] = 0.59        # one held-out item below min_confidence
    summary = write_back(config, 3, ["sentiment", "topic"], _write(tmp_path / "p.jsonl", rows), tmp_path / "bundle")

    assert sorted(_written(config)) == sorted(HELD[:-1])        # only held-out labelled items, at or above 0.6
    assert summary.describe() == (
        f"Wrote back to {writeback_path(config)}: sentiment: {len(HELD) - 1} predictions "
        f"(1 not an item of this run; {len(TRAINED)} trained on (leak guard); "
        f"{len(UNLABELLED)} unlabelled (include_unlabeled is false); 1 below min_confidence; 1 repeated); "
        "topic: 1 predictions not written back (not in model_training.writeback.schemas)")


def test_unlabelled_items_are_written_with_include_unlabeled(tmp_path):
    config = _project(tmp_path, schemas=("sentiment",), include_unlabeled=True)
    predictions = _write(tmp_path / "p.jsonl", _predict(tmp_path, LABELLED + UNLABELLED))
    write_back(config, 1, ["sentiment"], predictions, tmp_path / "bundle")
    assert sorted(_written(config)) == sorted(HELD + UNLABELLED)


def test_bad_lines_are_skipped_counted_and_named_and_leave_no_temporary_file(tmp_path):
    config = _project(tmp_path, schemas=("sentiment",), include_unlabeled=True)
    rows = [
        {"id": "r6", "schema": "sentiment", "label": "positive", "confidence": "high"},
        '{"id": "r7", "schema": "sentiment", "label": "positive", "confidence": NaN}',
        "not json at all",
        {"id": "r8", "schema": "sentiment", "label": "neutral", "confidence": 0.9},
        {"id": 8, "schema": "sentiment", "label": "positive", "confidence": 0.9},
        {"id": "r8", "schema": "sentiment", "label": "positive", "confidence": True},
        {"id": "r9", "schema": "sentiment", "label": "negative", "confidence": 0.7,
         "probs": {"positive": 0.3, "negative": 0.7}},            # a field writeback does not use
    ]
    predictions = _write(tmp_path / "p.jsonl", rows)
    summary = write_back(config, 2, ["sentiment"], predictions, tmp_path / "bundle")
    assert _written(config) == {"r9": {"sentiment": {"label": "negative", "confidence": 0.7, "run_id": 2}}}
    assert summary.describe_bad_lines(predictions) == (
        f"{predictions}: 6 prediction line(s) could not be read and were skipped (line 1: confidence is "
        "'high'; use a number from 0 to 1; line 2: confidence is nan; use a number from 0 to 1; line 3: "
        "not JSON; line 4: label is 'neutral', not a label of 'sentiment'; line 5: id is 8; use the item's "
        "id (a non-empty string); and 1 more)")
    assert not list(writeback_path(config).parent.glob("*.tmp"))


def test_the_newest_run_replaces_its_schemas_and_takes_down_what_it_trained_on(tmp_path):
    config = _project(tmp_path, ("sentiment",), schemas=("sentiment", "topic"), include_unlabeled=True)
    earlier = {"id": TRAINED[0], "predictions": {"sentiment": {"label": "negative", "confidence": 0.8, "run_id": 1},
                                                 "topic": {"label": "music", "confidence": 0.6, "run_id": 1}}}
    gone = {"id": "r9", "predictions": {"sentiment": {"label": "negative", "confidence": 0.8, "run_id": 1}}}
    _write(writeback_path(config), [earlier, gone])
    write_back(config, 2, ["sentiment"], _write(tmp_path / "p.jsonl", _predict(tmp_path, ["r8"])), tmp_path / "bundle")
    assert _written(config) == {
        TRAINED[0]: {"topic": {"label": "music", "confidence": 0.6, "run_id": 1}},  # sentiment taken down
        "r8": {"sentiment": {"label": "positive", "confidence": 0.9, "run_id": 2}},
    }


def test_a_file_from_before_this_format_is_carried_over(tmp_path):
    config = _project(tmp_path, ("sentiment",), schemas=("sentiment", "topic"), include_unlabeled=True)
    _write(writeback_path(config), [{"id": "r9", "schema": "topic", "label": "books", "confidence": 0.9, "run_id": 1}])
    write_back(config, 2, ["sentiment"], _write(tmp_path / "p.jsonl", _predict(tmp_path, ["r9"])), tmp_path / "bundle")
    assert _written(config) == {"r9": {"topic": {"label": "books", "confidence": 0.9, "run_id": 1},
                                       "sentiment": {"label": "positive", "confidence": 0.9, "run_id": 2}}}


def test_nothing_is_written_without_writeback_schemas(tmp_path):
    config = _project(tmp_path)
    summary = write_back(config, 1, ["sentiment"], _write(tmp_path / "p.jsonl", _predict(tmp_path, ["r9"])),
                         tmp_path / "bundle")
    assert not writeback_path(config).exists()
    assert summary.describe() == "Writeback: no schema of this run is listed in model_training.writeback.schemas"


def test_without_the_bundle_nothing_is_written(tmp_path):
    config = _project(tmp_path, schemas=("sentiment",), include_unlabeled=True)
    with pytest.raises(WritebackError, match=r"^Nothing was written back: the run's bundle .* cannot be read"):
        write_back(config, 1, ["sentiment"], _write(tmp_path / "p.jsonl", _predict(tmp_path, ["r9"])),
                   tmp_path / "missing")
    assert not writeback_path(config).exists()


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    config = _project(tmp_path, schemas=("sentiment",), include_unlabeled=True)
    writeback_path(config).mkdir(parents=True)  # os.replace onto a directory fails
    with pytest.raises(WritebackError, match=r"^Could not write the predictions to "):
        write_back(config, 1, ["sentiment"], _write(tmp_path / "p.jsonl", _predict(tmp_path, ["r9"])),
                   tmp_path / "bundle")
    assert writeback_path(config).is_dir() and not list(writeback_path(config).parent.glob(".*.tmp"))


@pytest.mark.parametrize("run_id", ["10**20", "Infinity", "-Infinity", "NaN", "1e300", "-3", "7.0", '"seven"', "true"])
def test_an_earlier_line_with_any_number_for_run_id_is_carried_over(tmp_path, run_id):
    config = _project(tmp_path, ("sentiment",), schemas=("sentiment", "topic"), include_unlabeled=True)
    value = str(10**20) if run_id == "10**20" else run_id
    _write(writeback_path(config), [
        '{"id": "r9", "predictions": {"topic": {"label": "books", "confidence": 0.9, "run_id": %s}}}' % value])
    write_back(config, 2, ["sentiment"], _write(tmp_path / "p.jsonl", _predict(tmp_path, ["r8"])), tmp_path / "bundle")
    assert _written(config) == {
        "r9": {"topic": {"label": "books", "confidence": 0.9, "run_id": 7 if run_id == "7.0" else 0}},
        "r8": {"sentiment": {"label": "positive", "confidence": 0.9, "run_id": 2}}}


def test_an_id_utf8_cannot_encode_is_written_back_as_its_json_escape(tmp_path):
    config = _project(tmp_path, ("sentiment",), schemas=("sentiment",), include_unlabeled=True)
    # A bundle no server builds today (data ids like this are refused), as a worker elsewhere might hold one.
    items = tmp_path / "bundle" / "items.jsonl"
    items.write_text(items.read_text() + json.dumps({"id": "\ud83d", "text": "t", "labels": {}, "holdout": False}) + "\n")
    summary = write_back(config, 2, ["sentiment"], _write(tmp_path / "p.jsonl", _predict(tmp_path, ["\ud83d"])),
                         tmp_path / "bundle")
    assert summary.written == {"sentiment": 1}
    assert writeback_path(config).read_bytes() == (
        b'{"id": "\\ud83d", "predictions": {"sentiment": {"label": "positive", "confidence": 0.9, "run_id": 2}}}\n')
    assert _written(config) == {"\ud83d": {"sentiment": {"label": "positive", "confidence": 0.9, "run_id": 2}}}
