"""Writeback (SPEC §10): the schemas asked for, at or above min_confidence, the newest run winning."""

from __future__ import annotations

import json
from dataclasses import replace

from potato.config import WritebackConfig
from potato.writeback import write_back, writeback_path
from tests.support.potato_project import make_project, project_config


def _config(tmp_path, **writeback):
    config = project_config(make_project(tmp_path, n_items=4))
    mt = replace(config.model_training, writeback=WritebackConfig(**writeback))
    return replace(config, model_training=mt)


def _predictions(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _written(config):
    return [json.loads(line) for line in writeback_path(config).read_text().splitlines()]


def test_writes_listed_schemas_at_or_above_min_confidence(tmp_path):
    config = _config(tmp_path, schemas=("sentiment",), min_confidence=0.6)
    rows = [{"id": "r0", "schema": "sentiment", "label": "positive", "confidence": 0.9},
            {"id": "r1", "schema": "sentiment", "label": "negative", "confidence": 0.6},
            {"id": "r2", "schema": "sentiment", "label": "negative", "confidence": 0.59},
            {"id": "r0", "schema": "topic", "label": "x", "confidence": 0.99}]
    summary = write_back(config, 7, _predictions(tmp_path / "p.jsonl", rows))
    assert _written(config) == [
        {"id": "r0", "schema": "sentiment", "label": "positive", "confidence": 0.9, "run_id": 7},
        {"id": "r1", "schema": "sentiment", "label": "negative", "confidence": 0.6, "run_id": 7}]
    assert summary.describe().endswith("sentiment: 2 predictions (1 below min_confidence)")


def test_the_newest_run_replaces_its_schemas_only(tmp_path):
    config = _config(tmp_path, schemas=("sentiment", "topic"))
    write_back(config, 1, _predictions(tmp_path / "a.jsonl", [
        {"id": "r0", "schema": "sentiment", "label": "positive", "confidence": 0.9},
        {"id": "r0", "schema": "topic", "label": "books", "confidence": 0.8}]))
    write_back(config, 2, _predictions(tmp_path / "b.jsonl", [
        {"id": "r0", "schema": "sentiment", "label": "negative", "confidence": 0.7}]))
    assert sorted((w["schema"], w["label"], w["run_id"]) for w in _written(config)) == [
        ("sentiment", "negative", 2), ("topic", "books", 1)]
    assert not list(writeback_path(config).parent.glob("*.tmp"))


def test_nothing_is_written_without_writeback_schemas(tmp_path):
    config = _config(tmp_path)
    summary = write_back(config, 1, _predictions(tmp_path / "p.jsonl", [
        {"id": "r0", "schema": "sentiment", "label": "positive", "confidence": 0.9}]))
    assert not writeback_path(config).exists()
    assert summary.describe() == "Writeback: no schema of this run is listed in model_training.writeback.schemas"
