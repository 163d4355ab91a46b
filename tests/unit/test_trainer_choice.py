"""Which trainer trains which schema: each trainer's declared kinds, each kind's default, a run's plan.

A run that names no trainer trains each schema with its kind's default
trainer (one run, several trainers); a run that names one is refused unless
that trainer trains every schema of the run — 409 from the API, exit 2 from
the CLI, and ``potato validate`` for ``writeback.schemas`` and
``auto_retrain``, each naming the schema, its type and the trainers that can.
Most tests run on a smaller installation (``small_installation``: no trainer
of span or continuous answers) with toy trainers registered from the test
(tests/support/toy_trainers.py), so what is said of a kind no trainer
trains stays tested; the package's own trainers are in
tests/unit/test_registries.py.
"""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from potato.cli import main
from potato.config import load_config
from potato.runs.jobs import make_job
from potato.runs.paths import open_store
from potato.runs.queue import create_run
from potato.server import create_app
from potato.trainer_choice import (
    NoTrainerFor,
    default_schemas,
    describe_plan,
    plan_trainers,
    trainer_kinds,
    trainers_for,
)
from potato.validate import validate_config_file
from tests.support import toy_trainers
from tests.support.potato_project import make_project

ADMIN = {"X-API-Key": "test-admin-key"}
API = "/admin/training/api"
SCHEMES = [
    {"annotation_type": "span", "name": "entities", "labels": ["PER", "LOC"]},
    {"annotation_type": "slider", "name": "score", "min_value": 0, "max_value": 100, "starting_value": 50},
    {"annotation_type": "pure_display", "name": "instructions"},
]
NO_SPAN_TRAINER = ("No trainer can train schema 'entities' (span): span answers are trained by hf-span-tagging, "
                   "which this installation does not have")


def _config_path(tmp_path, **model_training):
    path = make_project(tmp_path, n_items=10, model_training={"enabled": True, **model_training})
    raw = yaml.safe_load(path.read_text())
    raw["annotation_schemes"] += SCHEMES
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def small_installation(monkeypatch):
    """hf-text-classification of nominal answers and decision-calibrate, and no other trainer."""
    toy_trainers.keep_only(monkeypatch, {"hf-text-classification": ["nominal"], "decision-calibrate": ["nominal"]})


def test_each_trainer_declares_its_kinds_and_each_kind_its_trainers(monkeypatch, small_installation):
    assert trainer_kinds("hf-text-classification") == ("nominal",)
    assert trainer_kinds("decision-calibrate") == ("nominal",)
    assert trainer_kinds("no-such-trainer") == ()
    assert trainers_for("nominal") == ["hf-text-classification", "decision-calibrate"]
    toy_trainers.register(monkeypatch, "toy-span", ["span"], default_for=["span"])
    assert trainers_for("span") == ["toy-span"]


def test_a_run_without_a_trainer_trains_each_schema_with_its_kinds_default(tmp_path, monkeypatch, small_installation):
    config = load_config(_config_path(tmp_path))
    sentiment, entities, score = (config.scheme(n) for n in ("sentiment", "entities", "score"))
    assert plan_trainers([sentiment]) == {"hf-text-classification": ["sentiment"]}
    with pytest.raises(NoTrainerFor) as caught:
        plan_trainers([sentiment, entities])
    assert str(caught.value) == NO_SPAN_TRAINER
    toy_trainers.register(monkeypatch, "toy-span", ["span"], default_for=["span"])
    plan = plan_trainers([sentiment, entities])
    assert plan == {"hf-text-classification": ["sentiment"], "toy-span": ["entities"]}
    assert describe_plan(plan) == "hf-text-classification (sentiment) + toy-span (entities)"
    with pytest.raises(NoTrainerFor) as caught:
        plan_trainers([sentiment, score], "hf-text-classification")
    assert str(caught.value) == ("Trainer 'hf-text-classification' cannot train schema 'score' (slider); no "
                                 "trainer of this installation trains continuous answers")
    with pytest.raises(NoTrainerFor) as caught:
        plan_trainers([entities], "hf-text-classification")
    assert str(caught.value) == ("Trainer 'hf-text-classification' cannot train schema 'entities' (span); the "
                                 "trainers that can: toy-span")


def test_the_api_refuses_a_schema_no_trainer_of_the_run_trains_with_409(tmp_path, monkeypatch, small_installation):
    config = load_config(_config_path(tmp_path))
    store = open_store(config)
    client = create_app(config, start_background=False, store=store).test_client()
    refused = client.post(f"{API}/runs", headers=ADMIN, json={"schemas": ["sentiment", "entities"]})
    assert refused.status_code == 409 and refused.json == {"error": NO_SPAN_TRAINER}
    toy_trainers.register(monkeypatch, "toy-span", ["span"], default_for=["span"])
    named = client.post(f"{API}/runs", headers=ADMIN, json={"trainer": "hf-text-classification",
                                                            "schemas": ["sentiment", "entities"]})
    assert named.status_code == 409 and named.json["error"] == (
        "Trainer 'hf-text-classification' cannot train schema 'entities' (span); the trainers that can: toy-span")
    assert store.count_runs() == 0
    made = client.post(f"{API}/runs", headers=ADMIN, json={"schemas": ["sentiment", "entities"], "options": {"seed": 1}})
    assert made.status_code == 201
    run = made.json["run"]
    assert run["trainer"] == "hf-text-classification + toy-span"
    assert run["trainers"] == {"hf-text-classification": ["sentiment"], "toy-span": ["entities"]}
    assert run["trainers_text"] == "hf-text-classification (sentiment) + toy-span (entities)"
    job = make_job(config, store.get_run(run["id"]), bundle="bundle")
    assert job["trainer"] == "hf-text-classification + toy-span" and job["options"] == {}
    assert job["parts"] == [{"trainer": "hf-text-classification", "schemas": ["sentiment"], "options": {"seed": 1}},
                            {"trainer": "toy-span", "schemas": ["entities"], "options": {"seed": 1}}]
    form = client.get("/admin/training", headers=ADMIN).data.decode()
    assert 'value="entities" checked> entities <span class="hint">(span: toy-span)</span>' in form
    assert 'value="score"> score <span class="hint">(continuous: no trainer here)</span>' in form
    page = client.get(f"/admin/training/runs/{run['id']}", headers=ADMIN)
    assert b'<dt>Trainers</dt><dd id="run-trainers">hf-text-classification (sentiment) + toy-span (entities)</dd>' \
        in page.data


def test_a_run_without_schemas_trains_those_a_trainer_can_train(tmp_path, small_installation):
    config = load_config(_config_path(tmp_path))
    assert default_schemas(config) == ["sentiment"]  # no span trainer here; instructions train nowhere
    store = open_store(config)
    run = create_run(config, store)
    assert run.trainer == "hf-text-classification" and run.schemas == ["sentiment"] and run.plan == {}
    assert run.trainers == {"hf-text-classification": ["sentiment"]}


def test_the_cli_refuses_with_exit_2_naming_the_schema(tmp_path, small_installation):
    path = _config_path(tmp_path)
    result = CliRunner().invoke(main, ["training", "run", str(path), "--schema", "sentiment", "--schema", "score",
                                       "--trainer", "hf-text-classification", "--detach"])
    assert result.exit_code == 2
    assert result.output.endswith("Error: Trainer 'hf-text-classification' cannot train schema 'score' (slider); no "
                                  "trainer of this installation trains continuous answers\n")
    result = CliRunner().invoke(main, ["training", "run", str(path), "--detach"])
    assert result.exit_code == 0 and result.output.startswith("Run 1 queued: hf-text-classification on sentiment")


def test_validate_names_a_writeback_or_auto_retrain_schema_no_trainer_trains(tmp_path, monkeypatch, small_installation):
    path = _config_path(tmp_path, writeback={"schemas": ["sentiment", "entities"]},
                        auto_retrain={"enabled": False, "trainer": "hf-text-classification",
                                      "schemas": ["sentiment", "score"]})
    report = validate_config_file(path)
    assert [(e.path, e.message) for e in report.errors] == [
        ("model_training.writeback.schemas[1]", f"model_training.writeback.schemas[1] is 'entities': {NO_SPAN_TRAINER}"),
        ("model_training.auto_retrain.trainer", "model_training.auto_retrain.trainer is 'hf-text-classification': "
         "Trainer 'hf-text-classification' cannot train schema 'score' (slider); no trainer of this installation "
         "trains continuous answers"),
    ]
    toy_trainers.register(monkeypatch, "toy-span", ["span"], default_for=["span"])
    toy_trainers.register(monkeypatch, "toy-numbers", ["continuous"])
    report = validate_config_file(path)
    assert [e.path for e in report.errors] == ["model_training.auto_retrain.trainer"]
    raw = yaml.safe_load(path.read_text())
    del raw["model_training"]["auto_retrain"]["trainer"]  # each schema's default: hf-text-classification for score
    path.write_text(yaml.safe_dump(raw))
    assert [e.message for e in validate_config_file(path).errors] == [
        "model_training.auto_retrain.schemas[1] is 'score': No default trainer for schema 'score' (slider): "
        "continuous answers are trained by hf-text-classification, which does not train them in this installation; "
        "name a trainer that can: toy-numbers"]


def test_a_config_potato_212_accepts_with_its_own_sklearn_text_trainer_validates(tmp_path):
    path = _config_path(tmp_path, auto_retrain={
        "enabled": True, "trainer": "sklearn-text", "schemas": ["sentiment"],
        "params": {"classifier": "sklearn.linear_model.LogisticRegression", "classifier_kwargs": {"C": 2.0},
                   "vectorizer_kwargs": {"ngram_range": [1, 2]}, "calibrate": True, "min_instances": 10}})
    report = validate_config_file(path)
    assert report.errors == ()
    assert json.loads(json.dumps(report.config.model_training.auto_retrain.params))["calibrate"] is True


def test_a_stored_plan_keeps_its_trainers_in_the_order_of_their_first_schema(tmp_path):
    store = open_store(load_config(_config_path(tmp_path)))
    run = store.create_run("sklearn-text + hf-span-tagging", ["sentiment", "entities", "topics"], "local",
                           plan={"sklearn-text": ["sentiment", "topics"], "hf-span-tagging": ["entities"]})
    assert list(store.get_run(run.id).trainers.items()) == [("sklearn-text", ["sentiment", "topics"]),
                                                           ("hf-span-tagging", ["entities"])]
