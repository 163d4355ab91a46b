"""The CLI facing values a hostile or older store or a careless user gives it (issue 9, items 7 and 9)."""

from __future__ import annotations

import sqlite3

from click.testing import CliRunner

from potato.cli import main
from potato.runs import open_store
from tests.unit.test_server_support import make_config


def test_training_runs_lists_every_run_whatever_a_run_holds_as_scores(tmp_path):
    config = make_config(tmp_path)
    store = open_store(config)
    good = store.create_run("hf-text-classification", ["sentiment"], "local")
    store.update_run(good.id, scores={"sentiment": {"accuracy": 0.9, "macro_f1": 0.85, "n": 6}})
    bad = store.create_run("hf-text-classification", ["sentiment"], "local")
    empty = store.create_run("hf-text-classification", ["sentiment"], "local")
    store.update_run(empty.id, scores={"sentiment": {"accuracy": None, "macro_f1": None, "n": 0}})
    with sqlite3.connect(store.path) as db:  # what an older server let an agent store
        db.execute("UPDATE runs SET scores = ? WHERE id = ?", ('{"sentiment": 0.9}', bad.id))
    store.close()
    result = CliRunner().invoke(main, ["training", "runs", str(config.path)])
    assert result.exit_code == 0, result.output
    rows = result.output.splitlines()[1:]
    assert rows[0].endswith("  sentiment: no holdout scores")
    assert rows[1].endswith("  sentiment ?")
    assert rows[2].endswith("  sentiment acc 0.900 F1 0.850")


def test_a_nan_trainer_option_is_refused_before_a_run_is_queued(tmp_path):
    config = make_config(tmp_path)
    for value in ("NaN", "-Infinity", "1e999"):
        result = CliRunner().invoke(main, ["training", "run", str(config.path), "--option", f"learning_rate={value}",
                                           "--detach"])
        assert result.exit_code == 2
        assert f"Invalid value for --option: 'learning_rate={value}' is not a finite number; use a number" \
            in result.output
    assert open_store(config).count_runs() == 0
