"""``potato training runs``: one line per run, with what started it."""

from __future__ import annotations

from click.testing import CliRunner

from potato.runs.paths import open_store
from potato.runs.queue import create_run
from potato.cli import main
from potato.config import load_config
from tests.support.potato_project import make_project


def test_runs_lists_state_trigger_and_backend(tmp_path):
    config_path = make_project(tmp_path, n_items=5)
    config = load_config(config_path)
    store = open_store(config)
    create_run(config, store)
    create_run(config, store, trigger="auto", annotation_count=25)
    result = CliRunner().invoke(main, ["training", "runs", str(config_path)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "ID  STATE   TRIGGER  RAN ON  STARTED  DURATION  PREDICTIONS  CHANGED  SCORES",
        "2   queued  auto     local   -        -         -            -        -",
        "1   queued  manual   local   -        -         -            -        -",
    ]


def test_decision_calibrate_on_a_remote_backend_is_refused_with_exit_1(tmp_path):
    from tests.unit.test_server_admin_api import LOCAL_ONLY
    from tests.unit.test_server_support import BACKENDS

    config_path = make_project(tmp_path, n_items=5, model_training={"enabled": True, "backends": BACKENDS})
    for backend, kind in (("gpu-server", "an ssh"), ("cluster", "a slurm"), ("lab-workstation", "an agent")):
        result = CliRunner().invoke(main, ["training", "run", str(config_path), "--trainer", "decision-calibrate",
                                           "--backend", backend])
        assert result.exit_code == 1
        assert result.output == f"Error: {LOCAL_ONLY.format(name=backend, kind=kind)}\n"
    assert open_store(load_config(config_path)).count_runs() == 0


def test_curve_asks_the_trainer_for_a_learning_curve(tmp_path):
    config_path = make_project(tmp_path, n_items=5)
    result = CliRunner().invoke(main, ["training", "run", str(config_path), "--curve", "--option", "epochs=2",
                                       "--detach"])
    assert result.exit_code == 0, result.output
    assert open_store(load_config(config_path)).get_run(1).options == {"epochs": 2, "curve": True}
