"""The backend and trainer registries: every registered entry keeps its contract, and a new one is one line.

A toy backend type and a toy trainer (tests/support/toy_backend.py) are
registered by the tests below, not by the package, and the user sees them
wherever a user sees the real ones: ``potato validate``, ``potato training
check``, the Training page's Runs on menu and the admin API.
"""

from __future__ import annotations

import inspect

import pytest
import yaml
from click.testing import CliRunner

from potato.backend_types.type_registry import BACKEND_TYPES, configurable_types, resolve
from potato.backends.base import Steps
from potato.cli import main
from potato.config import KINDS as KEY_KINDS
from potato.config import load_config
from potato.runs.paths import open_store
from potato.runs.queue import create_run
from potato.server import create_app
from potato.trainer_choice import NoTrainerFor
from potato.training.answer_kinds import KINDS
from potato.training.trainers.registry import TRAINERS, hook, import_failure_message, load, module_names
from tests.support import toy_backend
from tests.support.potato_project import make_project
from tests.support.toy_backend import TOY, TOY_TRAINER
from tests.unit.test_server_support import ADMIN

# -- every registered backend type ---------------------------------------------


@pytest.mark.parametrize("name", list(BACKEND_TYPES))
def test_every_backend_type_keeps_the_steps_contract(name):
    steps = resolve(BACKEND_TYPES[name].steps)
    assert isinstance(steps, Steps)
    for step, declared in inspect.getmembers(Steps, inspect.isfunction):
        if step.startswith("_"):
            continue
        # The flow passes them positionally, so each step takes the contract's arguments in its order.
        want = len(inspect.signature(declared).parameters) - 1  # without self
        got = list(inspect.signature(getattr(steps, step)).parameters.values())
        assert len(got) == want and all(p.kind == p.POSITIONAL_OR_KEYWORD for p in got), (name, step)


@pytest.mark.parametrize("name", list(BACKEND_TYPES))
def test_every_backend_type_names_code_that_is_there(name):
    declared = BACKEND_TYPES[name]
    assert list(inspect.signature(resolve(declared.check)).parameters)[:2] == ["config", "backend"]
    if declared.leftovers:
        assert list(inspect.signature(resolve(declared.leftovers)).parameters) == ["config", "store", "run"]
    assert {k.kind for k in declared.keys} <= set(KEY_KINDS)
    assert declared.keys[0].name == "type" and declared.doc and "{name}" in declared.menu


def test_the_configurable_types_are_the_registry_s_in_its_order_without_the_built_in_one():
    built_in = [name for name, declared in BACKEND_TYPES.items() if not declared.configurable]
    assert built_in == ["local"]  # the one backend a config never declares: the annotation server's machine
    assert configurable_types() == [name for name in BACKEND_TYPES if name not in built_in]


# -- every registered trainer ---------------------------------------------------


@pytest.mark.parametrize("name", list(TRAINERS))
def test_every_trainer_declaration_agrees_with_its_module(name):
    info = TRAINERS[name]
    module = load(info)
    assert module.NAME == name
    assert getattr(module, "REQUIRED_MODULES", info.required_modules) == info.required_modules
    assert getattr(module, "USES_DEVICE", info.uses_device) == info.uses_device
    assert callable(module.train) and callable(module.check_options) and isinstance(module.DEFAULT_OPTIONS, dict)
    assert set(info.kinds) <= set(KINDS) and info.kinds
    for which in ("prepare", "record", "gpu_memory_mb"):
        assert getattr(info, which) is None or callable(hook(info, which))


def test_a_missing_module_is_named_with_the_pip_package_that_installs_it():
    # `pip install sklearn` fails: the backend's packages and pip take scikit-learn.
    assert import_failure_message("sklearn-text", "sklearn") == (
        "Trainer 'sklearn-text' could not be imported (missing module: sklearn, whose pip package is scikit-learn)")
    assert import_failure_message("hf-text-classification", "peft") == (
        "Trainer 'hf-text-classification' could not be imported (missing module: peft)")
    assert module_names(["torch", "sklearn"]) == "torch, sklearn (pip package scikit-learn)"
    assert TRAINERS["sklearn-text"].install_hint == "pip install 'potato-annotation[train-sklearn]'"


# -- a toy of each, registered from here ----------------------------------------


@pytest.fixture
def toys(monkeypatch):
    monkeypatch.setitem(BACKEND_TYPES, TOY.name, TOY)
    monkeypatch.setitem(TRAINERS, TOY_TRAINER.name, TOY_TRAINER)


def _project(tmp_path, **model_training):
    mt = {"enabled": False, "backend": "toy1",
          "backends": {"toy1": {"type": "toy", "host": "toybox.example.org", "flavour": "lemon"}}}
    mt.update(model_training)
    path = make_project(tmp_path, n_items=10, model_training=mt)
    raw = yaml.safe_load(path.read_text())
    raw["annotation_schemes"].append({"annotation_type": "likert", "name": "mood", "labels": ["1", "2", "3"]})
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_registered_toy_type_and_trainer_pass_potato_validate(tmp_path, toys):
    path = _project(tmp_path, trainers={"toy-trainer": {"rounds": 3}},
                    auto_retrain={"enabled": True, "trainer": "toy-trainer", "schemas": ["mood"], "backend": "toy1"})
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.output == f"{path}: valid (0 errors, 0 warnings, 0 acknowledged)\n" and result.exit_code == 0


def test_potato_validate_checks_a_toy_by_its_own_declaration(tmp_path, toys):
    path = _project(tmp_path, trainers={"toy-trainer": {"rounds": 0}},
                    auto_retrain={"enabled": True, "trainer": "toy-trainer", "schemas": ["sentiment"]})
    raw = yaml.safe_load(path.read_text())
    raw["model_training"]["backends"]["toy1"]["flavor"] = "lemon"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 1
    b = "model_training.backends.toy1"
    assert result.output.splitlines()[:3] == [
        f"error: {b}.flavor is not a key of a toy backend; did you mean `flavour`? Accepted keys: type, "
        "description, host, flavour, heartbeat_timeout_s",
        "error: model_training.auto_retrain.trainer is 'toy-trainer': Trainer 'toy-trainer' cannot train schema "
        "'sentiment' (radio); the trainers that can: hf-text-classification, decision-calibrate, sklearn-text, "
            "hf-llm-finetune",
        "error: model_training.trainers.toy-trainer: rounds must be a positive integer, got 0",
    ]


def test_potato_training_check_runs_the_toys_own_check(tmp_path, toys):
    path = _project(tmp_path)
    result = CliRunner().invoke(main, ["training", "check", "toy1", str(path)])
    assert (result.output, result.exit_code) == ("toy1: a toy at toybox.example.org, lemon\n", 0)


def test_the_runs_on_menu_and_the_trainers_api_show_the_toys(tmp_path, toys):
    config = load_config(_project(tmp_path))
    app = create_app(config, start_background=False, store=open_store(config))
    client = app.test_client()
    page = client.get("/admin/training", headers=ADMIN).get_data(as_text=True)
    assert '<option value="toy1" data-type="toy" selected>toy1 (toy at toybox.example.org)</option>' in page
    assert '<option value="toy-trainer">toy-trainer</option>' in page
    trainers = client.get("/admin/training/api/trainers", headers=ADMIN).json["trainers"]
    assert {"name": "toy-trainer", "description": "Counts to rounds, declared by a test", "kinds": ["ordinal"],
            "modalities": ["text"], "install_hint": "", "available": True, "unavailable_reason": "",
            "local_only": False, "uses_device": False, "required_modules": []} in trainers
    schemas = client.get("/admin/training/api/schemas", headers=ADMIN).json["schemas"]
    assert schemas == [
        {"name": "sentiment", "annotation_type": "radio", "kind": "nominal",
         "trainers": ["hf-text-classification", "decision-calibrate", "sklearn-text", "hf-llm-finetune"],
         "trainable": True,
         "default_trainer": "hf-text-classification"},
        {"name": "mood", "annotation_type": "likert", "kind": "ordinal",
         "trainers": ["hf-text-classification", "sklearn-text", "hf-llm-finetune", "toy-trainer"], "trainable": True,
         "default_trainer": "hf-text-classification"},
    ]


def test_a_run_request_for_a_trainer_that_cannot_train_the_schema_is_refused(tmp_path, toys):
    config = load_config(_project(tmp_path))
    store = open_store(config)
    with pytest.raises(NoTrainerFor, match=r"^Trainer 'toy-trainer' cannot train schema 'sentiment' \(radio\); "):
        create_run(config, store, trainer="toy-trainer", schemas=["sentiment"])
    assert create_run(config, store, trainer="toy-trainer", schemas=["mood"]).backend == "toy1"
    assert toy_backend.poll(None, None, None) == 0  # what a run of it would relay: its worker is done
