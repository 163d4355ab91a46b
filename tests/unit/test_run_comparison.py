"""``potato training compare``: runs side by side, with what differs marked."""

from __future__ import annotations

import json

from click.testing import CliRunner

from potato.cli import main
from potato.config import load_config
from potato.publish.facts import record_training_data
from potato.results.evaluation import write_evaluation
from potato.run_comparison import compare
from potato.runs.paths import open_store, run_paths
from potato.runs.queue import create_run
from tests.support.potato_project import make_project


def _finished(config, store, options, scores, confusion, labelled):
    run = create_run(config, store, options=options)
    store.update_run(run.id, state="succeeded", started_at=1000.0, finished_at=1042.0, gpu="CPU (2 threads)",
                     scores={"sentiment": {"kind": "nominal", **scores}})
    directory = run_paths(config, run.id).dir
    directory.mkdir(parents=True, exist_ok=True)
    record_training_data(directory, {"counts": {"items": 10, "labeled": {"sentiment": labelled},
                                                "holdout": {"sentiment": 4}}}, 2, options)
    write_evaluation(directory, {"format": 1, "run_id": run.id, "schemas": {"sentiment": {
        "labels": ["positive", "negative"], "confusion": confusion, "n": 4}}})
    return run.id


def _project(tmp_path):
    path = make_project(tmp_path, n_items=10)
    config = load_config(path)
    store = open_store(config)
    first = _finished(config, store, {"epochs": 3}, {"accuracy": 0.5, "macro_f1": 0.333, "n": 4},
                      [[2, 0], [2, 0]], 6)
    second = _finished(config, store, {"epochs": 5}, {"accuracy": 1.0, "macro_f1": 1.0, "n": 4},
                       [[2, 0], [0, 2]], 6)
    return path, config, store, first, second


def test_two_runs_side_by_side_mark_what_differs(tmp_path):
    path, config, store, first, second = _project(tmp_path)
    comparison = compare(config, store, [first, second])
    rows = {(r.section, r.name): r for r in comparison.rows}
    assert rows[("Options", "epochs")].values == ("3", "5") and rows[("Options", "epochs")].differs
    assert rows[("Data", "sentiment: labelled")].values == ("6", "6")
    assert not rows[("Data", "sentiment: labelled")].differs
    assert rows[("Holdout scores", "sentiment: accuracy")].values == ("0.500", "1.000")
    # From the confusion matrices: run 1 never said negative (no precision to count), run 2 got both right.
    assert rows[("Per label", "sentiment negative: F1")].values == ("0.000", "1.000")
    assert rows[("Run", "duration")].values == ("42s", "42s")

    result = CliRunner().invoke(main, ["training", "compare", str(path), str(first), str(second)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "Runs 1 and 2 side by side; * marks what differs"
    assert "* " + "  epochs".ljust(len("  sentiment positive: F1") + 2) + "3" in "\n".join(lines)
    assert any(line.startswith("    sentiment: labelled") and line.split()[-2:] == ["6", "6"] for line in lines)
    at = lines.index("Confusion matrices of sentiment (rows: the annotators' label; columns: the model's)")
    assert lines[at + 1:at + 5] == ["  run 1:", "              positive  negative",
                                    "    positive         2         0", "    negative         2         0"]

    as_json = json.loads(CliRunner().invoke(main, ["training", "compare", str(path), "1", "2", "--json"]).output)
    assert as_json["runs"] == [1, 2]
    assert {"section": "Options", "name": "epochs", "values": ["3", "5"], "differs": True} in as_json["rows"]
    assert as_json["confusions"]["sentiment"][1] == {"labels": ["positive", "negative"],
                                                    "confusion": [[2, 0], [0, 2]]}


def test_a_run_to_compare_must_exist_and_be_named_once(tmp_path):
    path, *_ = _project(tmp_path)
    runner = CliRunner()
    for args, message in (
            (["1"], "compare needs two runs or more, e.g. potato training compare config.yaml 7 9"),
            (["1", "1"], "run 1 is named twice: name each run once"),
            (["1", "9"], f"No run with id 9; list the project's runs with: potato training runs {path}")):
        result = runner.invoke(main, ["training", "compare", str(path), *args])
        assert (result.exit_code, result.output) == (1, f"Error: {message}\n")


def test_the_admin_api_and_the_compare_page_show_the_same_rows(tmp_path):
    from potato.server import create_app
    from tests.unit.test_server_support import ADMIN

    path, config, store, first, second = _project(tmp_path)
    admin = create_app(config, start_background=False, store=store).test_client()
    answer = admin.get(f"/admin/training/api/compare?runs={first},{second}", headers=ADMIN)
    assert answer.status_code == 200
    assert answer.get_json() == compare(config, store, [first, second]).as_dict()
    page = admin.get(f"/admin/training/compare?runs={first},{second}", headers=ADMIN).get_data(as_text=True)
    assert "<h1>Runs 1 and 2 side by side</h1>" in page
    assert ('<tr class="differs">\n      <th scope="row">epochs <span class="visually-hidden">(differs)</span></th>\n'
            "      <td>3</td><td>5</td>") in page
    assert 'aria-label="Confusion matrix of sentiment, run 2"' in page
    for query, status, message in (
            ("runs=1", 400, "compare needs two runs or more, e.g. potato training compare config.yaml 7 9"),
            ("runs=1,x", 400, "runs='1,x' is not a list of run ids; name them separated by commas, e.g. runs=7,9"),
            ("runs=0,1", 400, "runs='0,1' names no run: run ids are whole numbers from 1, e.g. runs=7,9"),
            ("runs=1,9", 404, "No run with id 9; list the project's runs with: potato training runs config.yaml")):
        answer = admin.get(f"/admin/training/api/compare?{query}", headers=ADMIN)
        assert (answer.status_code, answer.get_json()["error"]) == (status, message)
        page = admin.get(f"/admin/training/compare?{query}", headers=ADMIN)
        assert page.status_code == status and f'<p class="error" role="alert">{message}</p>' in \
            page.get_data(as_text=True).replace("&#39;", "'")
    assert admin.get("/admin/training/compare?runs=1,2").status_code == 302  # no key: the login page
