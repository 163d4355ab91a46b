"""One config for this project and Potato 2.12: its keys, its item sources, what validate says about each."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from potato.config import POTATO_212_KEYS, load_config
from potato.validate import validate_config_file
from tests.unit.test_config import seed_dict, write_project

# Every model_training key Potato 2.12.1 reads, as its own docs (config_key_docs.py) write them.
POTATO_212_MODEL_TRAINING = {
    "enabled": False,
    "retain_runs": 3,
    "grace_seconds": 20,
    "split_seed": 7,
    "splits": {"train": 0.8, "val": 0.1, "test": 0.1},
    "aggregation": "consensus",
    "auto_retrain": {"enabled": True, "trainer": "hf-text-classification", "schemas": ["sentiment"],
                     "update_frequency": 5, "min_interval_s": 0, "params": {"epochs": 2}},
    "max_wall_seconds": 600,
    "max_ram_mb": 4000,
    "device": "gpu",
    "num_threads": 2,
    "writeback": {"schemas": ["sentiment"], "min_confidence": 0.5, "field": "predictions",
                  "include_unlabeled": True},
}


def validate(tmp_path: Path, raw: dict):
    return validate_config_file(write_project(tmp_path, raw))


def _with(model_training=None, **top) -> dict:
    raw = seed_dict()
    del raw["model_training"]["backend"]
    if model_training is not None:
        raw["model_training"] = model_training
    raw.update(top)
    return raw


def test_every_potato_212_key_is_accepted_without_a_warning_and_honoured(tmp_path):
    report = validate(tmp_path, _with(POTATO_212_MODEL_TRAINING))
    assert report.errors == () and report.warnings == ()
    mt = report.config.model_training
    assert (mt.retain_runs, mt.split_seed, mt.splits, mt.aggregation, mt.device) == (
        3, 7, {"train": 0.8, "val": 0.1, "test": 0.1}, "consensus", "gpu")
    assert (mt.writeback.field, mt.writeback.min_confidence) == ("predictions", 0.5)
    ar = mt.auto_retrain
    assert (ar.enabled, ar.trainer, ar.schemas, ar.update_frequency, ar.min_interval_s, ar.params, ar.backend) == (
        True, "hf-text-classification", ("sentiment",), 5, 0, {"epochs": 2}, None)


def test_potato_212s_own_trainer_with_its_params_is_accepted(tmp_path):
    params = {"classifier": "sklearn.linear_model.LogisticRegression", "classifier_kwargs": {"C": 2.0},
              "vectorizer": "sklearn.feature_extraction.text.TfidfVectorizer",
              "vectorizer_kwargs": {"ngram_range": [1, 2]}, "calibrate": True, "min_instances": 10}
    auto_retrain = dict(POTATO_212_MODEL_TRAINING["auto_retrain"], trainer="sklearn-text", params=params)
    report = validate(tmp_path, _with(dict(POTATO_212_MODEL_TRAINING, auto_retrain=auto_retrain)))
    assert report.errors == () and report.warnings == ()
    assert (report.config.model_training.auto_retrain.trainer, report.config.model_training.auto_retrain.params) == (
        "sklearn-text", params)


def test_the_table_of_potato_212_keys_names_each_key_once():
    keys = [k for k, _ in POTATO_212_KEYS]
    assert len(keys) == len(set(keys))
    expected = {k for k in POTATO_212_MODEL_TRAINING} | {f"auto_retrain.{k}" for k in (
        "enabled", "trainer", "schemas", "update_frequency", "min_interval_s", "params")} | {
        f"writeback.{k}" for k in POTATO_212_MODEL_TRAINING["writeback"]}
    assert set(keys) == expected


def test_split_seed_alone_means_potato_212s_default_split(tmp_path):
    mt = validate(tmp_path, _with({"split_seed": 3})).config.model_training
    assert (mt.splits, mt.split_seed) == ({"train": 0.7, "val": 0.15, "test": 0.15}, 3)
    assert validate(tmp_path, _with({})).config.model_training.splits is None  # holdout_fraction decides


def test_a_shared_config_where_potato_212_would_also_retrain_warns(tmp_path):
    mt = dict(POTATO_212_MODEL_TRAINING, enabled=True)
    report = validate(tmp_path, _with(mt))
    assert [w.message for w in report.warnings] == [
        "model_training.enabled and model_training.auto_retrain.enabled are both true: a Potato 2.12 "
        "server reading this config would also retrain on its own, on the same annotations as this "
        "project's potato start; set model_training.enabled: false (this project trains either way)"]


ERRORS = {
    "a misspelt trainer": (
        {"auto_retrain": {"enabled": True, "trainer": "sklearn-txt", "schemas": ["sentiment"]}},
        "model_training.auto_retrain.trainer is 'sklearn-txt'; did you mean `sklearn-text`?; this project's "
        "trainers are: hf-text-classification, decision-calibrate, sklearn-text, hf-span-tagging, hf-llm-finetune, "
        "hf-reward-model, cold-start"),
    "2.12's trainer with a classifier from elsewhere": (
        {"auto_retrain": {"enabled": True, "trainer": "sklearn-text", "schemas": ["sentiment"],
                          "params": {"classifier": "os.system"}}},
        "model_training.auto_retrain.params: classifier 'os.system' is not in scikit-learn, xgboost or lightgbm; "
        "sklearn-text imports classes from those packages only"),
    "an unknown schema": (
        {"auto_retrain": {"enabled": True, "schemas": ["sentimnt"]}},
        "model_training.auto_retrain.schemas[0] is 'sentimnt', which is not a schema in annotation_schemes "
        "(it has: sentiment); did you mean `sentiment`?"),
    "no schemas": (
        {"auto_retrain": {"enabled": True, "trainer": "hf-text-classification"}},
        "model_training.auto_retrain.schemas is missing; auto-retraining needs the schemas to train, e.g. "
        "schemas: [sentiment]"),
    "bad trainer params": (
        {"auto_retrain": {"enabled": True, "schemas": ["sentiment"], "params": {"epochs": -1}}},
        "model_training.auto_retrain.params: epochs must be a positive integer, got -1"),
    "update_frequency of 0": (
        {"auto_retrain": {"enabled": True, "schemas": ["sentiment"], "update_frequency": 0}},
        "model_training.auto_retrain.update_frequency is 0; use a whole number of at least 1"),
    "splits with another name": (
        {"splits": {"train": 0.8, "dev": 0.2}},
        "model_training.splits is {'train': 0.8, 'dev': 0.2}; use a mapping of train, val and test to "
        "fractions, e.g. {train: 0.8, val: 0.1, test: 0.1}"),
    "two holdout rules": (
        {"holdout_fraction": 0.2, "split_seed": 0},
        "model_training.holdout_fraction and model_training.splits/split_seed both decide which items are "
        "held out; keep one (splits and split_seed are Potato 2.12's, holdout_fraction this project's)"),
    "holdout_fraction of 1": (
        {"holdout_fraction": 1},
        "model_training.holdout_fraction is 1: every labelled item would be held out, leaving nothing to "
        "train on; use a value below 1 (0 trains on every label)"),
    "aggregation": (
        {"aggregation": "mean"},
        "model_training.aggregation is 'mean'; use majority (most votes) or consensus (Dawid-Skene, weighs "
        "annotators by reliability)"),
    "writeback field id": (
        {"writeback": {"schemas": ["sentiment"], "field": "id"}},
        "model_training.writeback.field is 'id'; each record names its item under id, so use another key, "
        "e.g. predictions"),
    "a local-only trainer auto-retraining elsewhere": (
        {"auto_retrain": {"enabled": True, "trainer": "decision-calibrate", "schemas": ["sentiment"],
                          "backend": "gpu"},
         "backends": {"gpu": {"type": "ssh", "host": "gpu.example.org"}}},
        "model_training.auto_retrain.trainer is 'decision-calibrate', which runs only on the local backend, "
        "but auto-retraining would run it on 'gpu' (ssh); set model_training.auto_retrain.backend: local"),
    "NaN min_confidence": (
        {"writeback": {"schemas": ["sentiment"], "min_confidence": float("nan")}},
        "model_training.writeback.min_confidence is nan; use a number"),
}


@pytest.mark.parametrize("model_training, message", ERRORS.values(), ids=ERRORS.keys())
def test_a_bad_value_is_an_error_naming_key_and_fix(tmp_path, model_training, message):
    report = validate(tmp_path, _with(model_training))
    assert [e.message for e in report.errors] == [message]


def test_the_server_does_not_start_on_a_bad_auto_retrain_block(tmp_path):
    from potato.server.commands import start_command

    lines = []
    path = write_project(tmp_path, _with({"auto_retrain": {"enabled": True, "trainer": "sklearn-txt",
                                                           "schemas": ["sentiment"]}}))
    assert start_command(path, echo=lambda text="", err=False: lines.append(text)) == 1
    assert "model_training.auto_retrain.trainer is 'sklearn-txt'" in "\n".join(lines)
    assert "The server does not start on an invalid config" in lines[-1]


# --------------------------------------------------------------------------- Potato 2.12's pre_annotation

PRE = {"enabled": True, "predictions_file": "annotation_output/training/predictions.jsonl"}


def test_pre_annotation_pointing_at_our_file_is_quiet(tmp_path):
    assert validate(tmp_path, _with(pre_annotation=PRE)).warnings == ()


@pytest.mark.parametrize("pre, message", [
    (dict(PRE, predictions_file="predictions.json"),
     "pre_annotation.predictions_file is 'predictions.json', but this project writes its predictions to "
     "'annotation_output/training/predictions.jsonl'; point predictions_file there (relative to task_dir) "
     "so that Potato 2.12 shows them"),
    (dict(PRE, field="model"),
     "pre_annotation.field is 'model' and model_training.writeback.field is 'predictions'; Potato 2.12 "
     "reads predictions under pre_annotation.field, so make the two the same"),
])
def test_pre_annotation_that_would_not_show_our_predictions_warns(tmp_path, pre, message):
    assert [w.message for w in validate(tmp_path, _with(pre_annotation=pre)).warnings] == [message]


# --------------------------------------------------------------------------- item sources


def test_data_files_entries_may_name_an_encoding(tmp_path):
    raw = _with(data_files=[{"path": "data/reviews.json", "encoding": "latin-1"}, "data/reviews.json"])
    config = load_config(write_project(tmp_path, raw))
    assert config.data_files == (tmp_path.resolve() / "data" / "reviews.json",) * 2
    assert config.data_file_encodings == {tmp_path.resolve() / "data" / "reviews.json": "iso8859-1"}


def test_data_directory_is_relative_to_task_dir(tmp_path):
    (tmp_path / "items").mkdir()
    (tmp_path / "items" / "a.jsonl").write_text('{"id": "a", "text": "x"}\n')
    raw = _with(data_directory="items", data_directory_encoding="utf-8")
    del raw["data_files"]
    config = load_config(write_project(tmp_path, raw))
    assert (config.data_files, config.data_directory) == ((), tmp_path.resolve() / "items")


def _sources(tmp_path, **top):
    raw = _with(**top)
    for key, value in top.items():
        if value is None:
            del raw[key]
    return validate(tmp_path, raw)


SOURCE_ERRORS = {
    "parquet": (
        {"data_files": ["data/items.parquet"]}, "data_files[0]",
        "data_files[0] is 'data/items.parquet', a Parquet file, which this feature cannot read; convert it "
        "to JSON lines (e.g. pandas.read_parquet(f).to_json(out, orient='records', lines=True)) and list "
        "that file instead"),
    "unknown encoding": (
        {"data_files": [{"path": "data/reviews.json", "encoding": "klingon"}]}, "data_files[0].encoding",
        "data_files[0].encoding is 'klingon', which is not a text encoding Python knows; use e.g. utf-8 or "
        "latin-1"),
    **{f"{codec} encoding": (  # codecs Python knows that turn bytes into bytes, or text into text
        {"data_files": [{"path": "data/reviews.json", "encoding": codec}]}, "data_files[0].encoding",
        f"data_files[0].encoding is {codec!r}, which is not a text encoding Python knows; use e.g. utf-8 or "
        "latin-1") for codec in ("base64", "hex", "rot13", "zlib", "undefined")},
    "data_sources": (
        {"data_sources": [{"type": "url", "url": "https://example.org/items.jsonl"}]}, "data_sources",
        "data_sources is set, and this feature does not read data_sources (URLs, cloud storage, "
        "databases); list the items' files under data_files or put them in a data_directory"),
    "labels in MySQL": (
        {"database": {"type": "mysql", "host": "db", "database": "potato", "username": "u", "password": "p"}},
        "database",
        "database.type is 'mysql': the annotators' labels are in that database (table "
        "user_state_documents), and this feature reads labels only from "
        "<output_annotation_dir>/<user>/user_state.json; use Potato's default file storage (remove the "
        "database block) to train on this project"),
    "batch assignment files": (
        {"batch_assignment": {"groups": [{"name": "a", "data_file": "data/a.jsonl"}]}}, "batch_assignment.groups",
        "batch_assignment.groups name data files, which this feature does not read; list those files under "
        "data_files too"),
    "no directory": (
        {"data_files": None, "data_directory": "nope"}, "data_directory",
        None),
    "no source": (
        {"data_files": None}, "data_files",
        "data_files is missing; list the items' files under data_files (or name a data_directory), "
        "relative to task_dir"),
}


@pytest.mark.parametrize("top, path, message", SOURCE_ERRORS.values(), ids=SOURCE_ERRORS.keys())
def test_a_source_this_feature_cannot_read_fails_validation(tmp_path, top, path, message):
    report = _sources(tmp_path, **top)
    assert [e.path for e in report.errors] == [path]
    if message:
        assert report.errors[0].message == message


def test_database_type_file_keeps_labels_in_files(tmp_path):
    report = _sources(tmp_path, database={"type": "file", "host": "-", "database": "-", "username": "-"})
    assert report.ok and report.warnings == ()


def test_an_empty_data_directory_warns_unless_watched(tmp_path):
    (tmp_path / "incoming").mkdir()
    (tmp_path / "incoming" / "notes.txt").write_text("not items")
    report = _sources(tmp_path, data_files=None, data_directory="incoming")
    assert [w.message for w in report.warnings] == [
        "data_directory 'incoming' holds no .json, .jsonl, .csv, .tsv files, so runs have no items"]
    assert _sources(tmp_path, data_files=None, data_directory="incoming", watch_data_directory=True).warnings == ()


def test_the_shipped_seed_keys_still_load(tmp_path):
    # A regression guard for the seeds' config: it has no 2.12-only key and must stay quiet.
    assert validate(tmp_path, yaml.safe_load(yaml.safe_dump(seed_dict()))).warnings == ()


def test_potato_validate_fails_on_labels_kept_in_mysql(tmp_path):
    from click.testing import CliRunner

    from potato.cli import main

    raw = _with(database={"type": "mysql", "host": "db", "database": "potato", "username": "u", "password": "p"})
    path = write_project(tmp_path, raw)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 1
    assert ("error: database.type is 'mysql': the annotators' labels are in that database (table "
            "user_state_documents)") in result.output
