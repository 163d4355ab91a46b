"""What a run request is refused or warned about before anything is queued: the same words from
``potato training run``, the admin API (the Training page's start button posts there) and auto-retraining.

Also the other words a user reads around a run's start and end here: a placeholder admin key, an
unknown run id, who cancelled a run.
"""

from __future__ import annotations

import getpass

import pytest
from click.testing import CliRunner

from potato.cli import main
from potato.config import load_config
from potato.runs.paths import open_store
from potato.training.trainers.hf_llm_finetune import NO_MODEL_MESSAGE
from tests.support.potato_project import make_project
from tests.unit.test_server_support import *  # noqa: F401,F403 - fixtures
from tests.unit.test_server_support import BACKENDS

API = "/admin/training/api"
TRAINERS = ("cold-start, decision-calibrate, hf-llm-finetune, hf-reward-model, hf-span-tagging, "
            "hf-text-classification, sklearn-text")


def _project(tmp_path, **model_training):
    mt = {"enabled": True, "backends": BACKENDS, **model_training}
    return make_project(tmp_path, n_items=6, model_training=mt)


def _run(*args: str):
    return CliRunner().invoke(main, ["training", "run", *args])


def test_an_llm_run_without_a_model_is_refused_at_once_naming_where_to_set_it(tmp_path):
    assert NO_MODEL_MESSAGE == (
        "hf-llm-finetune has no model: set model_training.trainers.hf-llm-finetune.model in the config (or, for one "
        "run, --option model=…) to a local model directory or a Hugging Face hub id (no model ships with Potato; "
        "docs/trainers/hf-llm-finetune.md names some)")
    config = _project(tmp_path)
    refused = _run(str(config), "--trainer", "hf-llm-finetune", "--detach")
    assert (refused.exit_code, refused.output.splitlines()[-1]) == (1, f"Error: {NO_MODEL_MESSAGE}")
    assert open_store(load_config(config)).count_runs() == 0  # nothing queued, nothing to fail 27 s later
    given = _run(str(config), "--trainer", "hf-llm-finetune", "--option", "model=/models/qwen", "--detach")
    assert given.exit_code == 0 and "Run 1 queued: hf-llm-finetune on sentiment" in given.output


def test_the_api_refuses_it_with_the_same_words(admin, store):
    answer = admin.post(f"{API}/runs", json={"trainer": "hf-llm-finetune", "schemas": ["sentiment"],
                                             "backend": "local"})
    assert (answer.status_code, answer.json) == (400, {"error": NO_MODEL_MESSAGE})
    bad = admin.post(f"{API}/runs", json={"trainer": "hf-text-classification", "backend": "local",
                                          "options": {"epochs": -1}})
    assert (bad.status_code, bad.json["error"]) == (
        400, "hf-text-classification: epochs must be a positive integer, got -1")  # the worker's own check, now
    assert store.count_runs() == 0


def test_auto_retraining_says_why_it_queued_nothing(tmp_path):
    from potato.runs.auto_retrain import AutoRetrainWatcher

    config = load_config(_project(tmp_path, auto_retrain={
        "enabled": True, "trainer": "hf-llm-finetune", "schemas": ["sentiment"], "update_frequency": 1}))
    store = open_store(config)
    watcher = AutoRetrainWatcher(config, store)
    assert watcher.check_once() is None  # refused, not raised: the watcher goes on watching
    assert watcher.status()["text"] == f"no run queued: {NO_MODEL_MESSAGE}"
    assert store.count_runs() == 0


def test_a_misspelled_backend_or_trainer_gets_a_did_you_mean(tmp_path, admin):
    config = str(_project(tmp_path))
    backend = _run(config, "--backend", "gpu-sever", "--detach")
    assert (backend.exit_code, backend.output.splitlines()[-1]) == (
        1, "Error: No backend named 'gpu-sever' in model_training.backends; did you mean `gpu-server`? Known "
           "backends: cluster, gpu-server, lab-workstation, local")
    trainer = _run(config, "--trainer", "hf-text-clasification", "--detach")
    assert (trainer.exit_code, trainer.output.splitlines()[-1]) == (
        1, f"Error: Unknown trainer 'hf-text-clasification'; did you mean `hf-text-classification`? Known "
           f"trainers: {TRAINERS}")
    far = _run(config, "--trainer", "bert", "--detach")  # nothing close: the list alone, as before
    assert far.output.splitlines()[-1] == f"Error: Unknown trainer 'bert'; known trainers: {TRAINERS}"
    check = CliRunner().invoke(main, ["training", "check", "lokal", config])
    assert (check.exit_code, check.output) == (
        1, "Error: No backend named 'lokal' in model_training.backends; did you mean `local`? Known backends: "
           "cluster, gpu-server, lab-workstation, local\n")
    answer = admin.post(f"{API}/runs", json={"backend": "gpu-sever"})
    assert (answer.status_code, answer.json["error"]) == (
        409, "No backend named 'gpu-sever' in model_training.backends; did you mean `gpu-server`? Known backends: "
             "cluster, gpu-server, lab-workstation, local")
    answer = admin.post(f"{API}/runs", json={"trainer": "sklearn-txt"})
    assert (answer.status_code, answer.json["error"]) == (
        400, f"Unknown trainer 'sklearn-txt'; did you mean `sklearn-text`? Known trainers: {TRAINERS}")


def test_training_run_shows_the_warnings_validate_and_start_show(tmp_path):
    from potato.server.commands import check_config

    config = str(_project(tmp_path, max_wal_seconds=600))
    warned = ("warning: model_training.max_wal_seconds is not a key of model_training; did you mean "
              "`max_wall_seconds`? Accepted keys: ")
    run = _run(config, "--detach")
    assert run.exit_code == 0
    assert [line for line in run.output.splitlines() if line.startswith(warned)] != []
    validate = CliRunner().invoke(main, ["validate", config])
    said = []
    check_config(config, echo=lambda text, err=False: said.append(text))
    # One check, one wording: the same line from all three.
    ours = [line for line in run.output.splitlines() if line.startswith("warning: ")]
    assert ours == [line for line in validate.output.splitlines() if line.startswith("warning: ")] == said


def test_the_examples_placeholder_admin_key_is_warned_about(tmp_path):
    from potato.server.commands import check_config

    config = tmp_path / "config.yaml"
    config.write_text(make_project(tmp_path, n_items=4).read_text().replace("test-admin-key", "change-me"))
    warning = ("warning: admin_api_key is 'change-me', the example's placeholder: anyone who has read the example "
               "can log in to the Training page and start, cancel, retract and publish runs. Set a secret of your "
               "own, e.g. the output of: python3 -c 'import secrets; print(secrets.token_urlsafe(24))'")
    validate = CliRunner().invoke(main, ["validate", str(config), "--strict"])
    assert validate.exit_code == 1 and warning in validate.output.splitlines()
    said = []
    assert check_config(config, echo=lambda text, err=False: said.append(text)) is not None  # it still starts
    assert said == [warning]
    example = CliRunner().invoke(main, ["validate", "examples/review-sentiment/config.yaml"])
    assert warning in example.output.splitlines()


def test_an_unknown_run_id_points_to_the_list_of_runs(tmp_path):
    config = str(_project(tmp_path))
    for command in ("cancel", "retract"):
        result = CliRunner().invoke(main, ["training", command, config, "99"])
        assert (result.exit_code, result.output) == (
            1, f"Error: No run with id 99; list the project's runs with: potato training runs {config}\n")


def test_a_cancel_says_who_asked(tmp_path, admin, project, store, client):
    from potato.backends.relay import check_limits
    from potato.runs.queue import create_run

    config = str(_project(tmp_path))
    CliRunner().invoke(main, ["training", "run", config, "--detach"])
    queued = CliRunner().invoke(main, ["training", "cancel", config, "1"])
    assert queued.output == "Run 1 was queued and is now cancelled\n"
    assert open_store(load_config(config)).get_run(1).error == (
        f"Cancelled before it started, with potato training cancel, by the account {getpass.getuser()}")

    ran = [create_run(project, store, backend="local") for _ in range(2)]
    for run in ran:
        store.transition(run.id, "running", from_states="queued")
    assert admin.post(f"{API}/runs/{ran[0].id}/cancel").status_code == 200  # X-API-Key: a script
    client.post("/admin/training/login", data={"api_key": "test-admin-key"})
    assert client.post(f"{API}/runs/{ran[1].id}/cancel", headers={"X-Requested-With": "potato"}).status_code == 200

    class Context:  # what the relay's limit check reads of a run's context
        config, store = project, None

    Context.store = store
    said = [str(check_limits(Context, store.get_run(run.id), 0.0)) for run in ran]
    assert said == ["Cancelled through the admin API (X-API-Key)", "Cancelled from the Training page (Cancel run)"]
    assert [e.data for e in store.events(ran[1].id) if e.kind == "cancel"] == [
        {"by": "from the Training page (Cancel run)"}]
