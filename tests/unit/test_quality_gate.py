"""The quality gate: a run no better than the trivial baseline, one that gives one label to everything, and one
worse than the run annotators see now are not written back; each can be promoted; a pinned run stays.

Each run here is recorded by the flow's own record-results step (``potato.results.record_results.record_results``) on a real
bundle of a generated project; only the worker's predictions are written by the test.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from potato.bundle.build import build_bundle
from potato.cli import main
from potato.config import load_config
from potato.results import quality_gate
from potato.results.record_results import record_results
from potato.results.writeback import live_runs_by_schema, read_report, writeback_path
from potato.runs.paths import open_store, run_paths
from potato.runs.queue import create_run
from tests.support.potato_project import make_project

N_ITEMS = 80
FRACTION = 0.3
LABELS = ("positive", "negative")


class Log:
    """The run log's two levels, kept as lines."""

    def __init__(self):
        self.lines: list[tuple[str, str]] = []

    def info(self, text):
        self.lines.append(("info", text))

    def warning(self, text):
        self.lines.append(("warning", text))


def _truth(i: int) -> str:
    return LABELS[i % 2]


@pytest.fixture()
def project(tmp_path):
    path = make_project(tmp_path, n_items=N_ITEMS, labeled_fraction=0.8, disagree_every=0, model_training={
        "enabled": True, "holdout_fraction": FRACTION,
        "writeback": {"schemas": ["sentiment"], "include_unlabeled": True}})
    return path


def _record(config_path: Path, answer, **writeback) -> tuple[int, Log]:
    """Queue a run, give it predictions ``answer(i)`` for every item, record its results as the flow does."""
    config = load_config(config_path)
    if writeback:
        config = replace(config, model_training=replace(
            config.model_training, writeback=replace(config.model_training.writeback, **writeback)))
    store = open_store(config)
    run = create_run(config, store)
    store.transition(run.id, "succeeded", from_states=("queued",))
    paths = run_paths(config, run.id)
    bundle = paths.dir / "bundle"
    build_bundle(config, ["sentiment"], bundle)
    paths.dir.mkdir(parents=True, exist_ok=True)
    paths.predictions.write_text("".join(json.dumps({"id": f"r{i}", "schema": "sentiment", "label": answer(i),
                                                      "confidence": 0.9}) + "\n" for i in range(N_ITEMS)))
    log = Log()
    ctx = SimpleNamespace(config=config, store=store, run_id=run.id, run=store.get_run(run.id), run_dir=paths.dir,
                          bundle_dir=bundle, paths=paths, log=log)
    record_results(ctx)
    return run.id, log


def _gate_lines(log: Log) -> list[tuple[str, str]]:
    return [(level, text) for level, text in log.lines
            if text.startswith("sentiment: ") and "predicted labels changed since" not in text]


def _runs_column(config_path: Path) -> dict[str, str]:
    out = CliRunner().invoke(main, ["training", "runs", str(config_path)]).output.splitlines()
    start = out[0].index("PREDICTIONS")
    return {line.split()[0]: line[start:start + len("PREDICTIONS  ")].strip() for line in out[1:]}


def test_a_good_run_is_written_back_and_says_what_it_beat(project):
    run_id, log = _record(project, _truth)
    ((level, text),) = _gate_lines(log)
    assert level == "info"
    assert re.fullmatch(r"sentiment: holdout accuracy 1\.00 beats always answering `(positive|negative)` "
                        r"\(0\.\d\d\) on \d+ held-out answers: written back", text), text
    assert live_runs_by_schema(load_config(project)) == {"sentiment": run_id}
    assert _runs_column(project) == {"1": "live"}


def test_a_run_that_gives_one_label_to_everything_is_held_back_and_can_be_promoted(project):
    good, _ = _record(project, _truth)
    collapsed, log = _record(project, lambda i: "negative")
    config = load_config(project)
    ((level, text),) = _gate_lines(log)
    assert (level, text) == ("warning", f"sentiment: every one of its {N_ITEMS} predictions is `negative`, though "
                             "its training answers hold more than one; its predictions were not written back "
                             f"(`potato training promote {config.path} {collapsed}` writes them back anyway)")
    assert live_runs_by_schema(config) == {"sentiment": good}  # annotators keep the good run's
    assert _runs_column(project) == {str(collapsed): "held back", str(good): "live"}
    held = quality_gate.held_back(run_paths(config, collapsed))
    assert [v["rule"] for v in held] == ["collapsed"]

    promoted = CliRunner().invoke(main, ["training", "promote", str(project), str(collapsed)])
    assert promoted.exit_code == 0, promoted.output
    assert promoted.output.splitlines()[0] == f"Run {collapsed} promoted: annotators see its predictions now"
    assert live_runs_by_schema(config) == {"sentiment": collapsed}
    records = [json.loads(line) for line in writeback_path(config).read_text().splitlines()]
    assert {r["predictions"]["sentiment"]["label"] for r in records} == {"negative"}
    assert _runs_column(project) == {str(collapsed): "live", str(good): "-"}
    assert quality_gate.read(run_paths(config, collapsed))["promoted"]["by"].startswith(
        "with potato training promote, by the account ")
    assert read_report(config, collapsed)["gate"][0].startswith(
        "Promoted past the quality gate with potato training promote, by the account ")


def test_a_run_no_better_than_the_majority_label_is_held_back(project):
    # Right on the training items' majority only: every held-out answer of the other label is wrong,
    # and a few items get the other label so that it is not one answer for everything.
    run_id, log = _record(project, lambda i: "positive" if i % 5 else "negative")
    ((level, text),) = _gate_lines(log)
    assert level == "warning"
    assert text.startswith("sentiment: holdout accuracy ")
    assert " is no better than always answering `" in text
    assert text.endswith(f"held-out answers; its predictions were not written back (`potato training promote "
                         f"{load_config(project).path} {run_id}` writes them back anyway)")
    assert not writeback_path(load_config(project)).exists()


def test_a_run_worse_than_the_live_one_is_held_back(project):
    good, _ = _record(project, _truth)
    scored = [int(line["id"][1:]) for line in map(json.loads, run_paths(load_config(project), good).labels.open())
              if line["holdout"]]
    # 3 of about 20 held-out answers wrong: well above the baseline, clearly below the live run's none.
    wrong = set(scored[:3])
    worse, log = _record(project, lambda i: LABELS[(i + 1) % 2] if i in wrong else _truth(i))
    ((level, text),) = _gate_lines(log)
    assert level == "warning", text
    assert text.startswith("sentiment: holdout accuracy 0.")
    assert f" is below run {good}'s 1.00 on the " in text
    assert text.endswith(f"held-out answers both runs scored; annotators keep run {good}'s predictions "
                         f"(`potato training promote {load_config(project).path} {worse}` writes them back anyway)")
    assert live_runs_by_schema(load_config(project)) == {"sentiment": good}
    promoted = CliRunner().invoke(main, ["training", "promote", str(project), str(worse)])
    assert promoted.exit_code == 0, promoted.output
    assert live_runs_by_schema(load_config(project)) == {"sentiment": worse}


def test_a_pinned_run_stays_until_unpinned(project):
    first, _ = _record(project, _truth)
    config = load_config(project)
    pinned = CliRunner().invoke(main, ["training", "pin", str(project), str(first)])
    assert (pinned.exit_code, pinned.output) == (0, (
        f"Run {first} is pinned: annotators keep its predictions, and newer runs of its schemas are held back "
        f"until `potato training unpin {config.path} {first}`\n"))
    second, log = _record(project, _truth)
    assert _gate_lines(log) == [("warning", (
        f"sentiment: run {first} is pinned, so annotators keep its predictions (`potato training unpin "
        f"{config.path} {first}` lets newer runs replace them); `potato training promote {config.path} {second}` "
        "writes them back anyway"))]
    assert _runs_column(project) == {str(second): "held back", str(first): "live, pinned"}
    refused = CliRunner().invoke(main, ["training", "pin", str(project), str(second)])
    assert (refused.exit_code, refused.output) == (1, (
        f"Error: Run {second} cannot be pinned: annotators do not see its predictions now (`potato training "
        f"promote {config.path} {second}` writes them back first)\n"))
    CliRunner().invoke(main, ["training", "unpin", str(project), str(first)])
    third, log = _record(project, _truth)
    assert _gate_lines(log)[0][0] == "info" and live_runs_by_schema(config) == {"sentiment": third}


def test_too_few_held_out_answers_are_written_back_unjudged_and_the_gate_can_be_off(project):
    _, log = _record(project, lambda i: "negative", min_holdout=10_000)
    # One answer for everything is refused whatever the holdout's size.
    assert _gate_lines(log)[0][1].startswith("sentiment: every one of its ")
    _, log = _record(project, lambda i: "positive" if i % 5 else "negative", min_holdout=10_000)
    ((level, text),) = _gate_lines(log)
    assert level == "info" and text.startswith("sentiment: only ")
    assert text.endswith(" held-out answer(s) (writeback.min_holdout: 10000), too few to judge the model: "
                         "written back unjudged")
    run_id, log = _record(project, lambda i: "negative", gate=False)
    assert _gate_lines(log) == [("info", "sentiment: written back unjudged (writeback.gate is false)")]
    assert live_runs_by_schema(load_config(project)) == {"sentiment": run_id}


def test_promote_refuses_a_run_with_nothing_to_show(project):
    config = load_config(project)
    store = open_store(config)
    run = create_run(config, store)
    result = CliRunner().invoke(main, ["training", "promote", str(project), str(run.id)])
    assert (result.exit_code, result.output) == (1, f"Error: Run {run.id} cannot be promoted: it is queued\n")


def _labels_file(path: Path, lines) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.parametrize("kind,train,held,words", [
    ("span", [[{"start": 0, "end": 4, "label": "FOOD"}]] * 6,
     [([{"start": 0, "end": 4, "label": "FOOD"}], [])] * 8, "predicting nothing (0.00)"),
    ("continuous", [1.0, 3.0] * 3, [(2.0, 5.0)] * 8, "always answering the training mean, 2 (0.00)"),
    ("multilabel", [["a"], ["a", "b"], ["a"]] * 2, [(["a"], ["b"])] * 8, "always answering `a` (1.00)"),
    # A position bias: the first reply shown wins most training majorities; ties are no side.
    ("comparison", [{"A": 2, "B": 0, "tie": 1}, {"A": 1, "B": 1, "tie": 0}, {"A": 0, "B": 1, "tie": 0},
                    {"A": 3, "B": 0, "tie": 0}] * 2,
     [({"A": 1, "B": 2, "tie": 0}, "A")] * 6 + [({"A": 1, "B": 1, "tie": 1}, "B")] * 2,
     "always preferring `A` (the training answers' commonest majority) (0.00)"),
    ("ranking", [[["b", "a"]], [["b", "a"], ["a", "b"]], [["b", "a"]]] * 2, [([["a", "b"]], ["b", "a"])] * 8,
     "always answering `b > a` (the training answers' Borda count) (0.00)"),
])
def test_each_kind_has_its_trivial_baseline_in_words(project, kind, train, held, words):
    verdict = _judged(project, kind, train, held)
    assert not verdict.written
    assert f" is no better than {words} on 8 held-out answers" in verdict.text


def _judged(project: Path, kind: str, train, held, labels=None) -> quality_gate.Verdict:
    """The gate's verdict on schema ``x`` of *kind*, from a run's labels.jsonl of *train* and *held* answers."""
    config = load_config(project)
    fields = {"span": "spans", "continuous": "value", "multilabel": "label", "comparison": "label",
              "ranking": "order"}
    _labels_file(run_paths(config, 9).labels, [{"id": f"t{k}", "schema": "x", "gold": g, "holdout": False}
                                               for k, g in enumerate(train)]
                 + [{"id": f"h{k}", "schema": "x", "gold": g, "holdout": True, fields[kind]: p}
                    for k, (g, p) in enumerate(held)])
    config = replace(config, model_training=replace(
        config.model_training, writeback=replace(config.model_training.writeback, schemas=("x",))))
    labels = labels or {"span": ["FOOD"], "comparison": ["A", "B"]}.get(kind, ["a", "b"])
    (verdict,) = quality_gate.judge(config, 9, {"x": kind}, {"x": labels})
    return verdict


def test_a_comparison_and_a_ranking_that_beat_their_baselines_are_written_back(project):
    comparison = _judged(project, "comparison", [{"A": 2, "B": 0, "tie": 0}] * 6,
                         [({"A": 0, "B": 2, "tie": 1}, "B")] * 7 + [({"A": 2, "B": 1, "tie": 0}, "B")])
    assert (comparison.written, comparison.text, comparison.score, comparison.baseline) == (
        True, "x: holdout agreement 0.88 beats always preferring `A` (the training answers' commonest majority) "
              "(0.12) on 8 held-out answers: written back", 0.875, 0.125)
    # Three labels: each order implies three pairs; the model keeps all three, the baseline one of them.
    ranking = _judged(project, "ranking", [[["a", "b", "c"]]] * 6, [([["c", "b", "a"]], ["c", "b", "a"])] * 8,
                      ["a", "b", "c"])
    assert (ranking.written, ranking.score) == (True, 1.0), ranking.text
    assert ranking.text.startswith("x: holdout pairwise agreement 1.00 beats always answering `a > b > c` (the "
                                   "training answers' Borda count) (0.00)"), ranking.text


def test_the_admin_api_lists_the_verdicts_promotes_and_pins(project):
    from potato.server import create_app
    from tests.unit.test_server_support import ADMIN

    good, _ = _record(project, _truth)
    worse, _ = _record(project, lambda i: "negative")
    config = load_config(project)
    store = open_store(config)
    client = create_app(config, start_background=False, store=store).test_client()
    api = "/admin/training/api"
    runs = {r["id"]: r for r in client.get(f"{api}/runs", headers=ADMIN).json["runs"]}
    assert (runs[good]["predictions_state"], runs[worse]["predictions_state"]) == ("live", "held back")
    assert (runs[good]["promotable"], runs[worse]["promotable"]) == (False, True)
    assert runs[worse]["gate_text"] == [quality_gate.held_back(run_paths(config, worse))[0]["text"]]
    shown = client.get(f"{api}/writeback", headers=ADMIN).json
    assert shown["run_id"] == good and shown["held_back"] == [f"Run {worse} was not written back: "
                                                              f"{runs[worse]['gate_text'][0]}"]

    bad = client.put(f"{api}/runs/{good}/pin", json={"pinned": "yes"}, headers=ADMIN)
    assert (bad.status_code, bad.json["error"]) == (400, 'The body must be {"pinned": true} or {"pinned": false}')
    promoted = client.post(f"{api}/runs/{worse}/promote", headers=ADMIN)
    assert promoted.status_code == 200, promoted.json
    assert promoted.json["run"]["predictions_state"] == "live"
    assert promoted.json["writeback"].startswith(f"Wrote back to {writeback_path(config)}: sentiment: ")
    assert quality_gate.read(run_paths(config, worse))["promoted"]["by"] == "by a caller of the admin API"
    refused = client.put(f"{api}/runs/{good}/pin", json={"pinned": True}, headers=ADMIN)
    assert (refused.status_code, refused.json["error"]) == (409, (
        f"Run {good} cannot be pinned: annotators do not see its predictions now (`potato training promote "
        f"{config.path} {good}` writes them back first)"))
    pinned = client.put(f"{api}/runs/{worse}/pin", json={"pinned": True}, headers=ADMIN)
    assert pinned.status_code == 200 and pinned.json["run"]["predictions_state"] == "live, pinned"
    again = client.post(f"{api}/runs/{worse}/promote", headers=ADMIN)
    assert again.status_code == 200  # promoting a live run writes the same predictions again


def test_a_calibration_of_a_held_back_run_leaves_what_annotators_see(project, tmp_path):
    from potato.trainer_hooks import decision_calibrate as calibration
    from potato.training.trainers.decision_calibrate import SOURCE_DIR, SOURCE_FILE

    good, _ = _record(project, _truth)
    held, _ = _record(project, lambda i: "negative")
    config = load_config(project)
    store = open_store(config)
    written = writeback_path(config).read_bytes()
    # What decision-calibrate's worker leaves: the held-back run's predictions with new confidences, kept.
    calibrating = create_run(config, store, trainer="decision-calibrate")
    paths = run_paths(config, calibrating.id)
    bundle = tmp_path / "bundle"
    (bundle / SOURCE_DIR).mkdir(parents=True)
    (bundle / SOURCE_DIR / SOURCE_FILE).write_text(json.dumps({"run_id": held, "schemas": {"sentiment": LABELS}}))
    (paths.dir / "artifacts").mkdir(parents=True)
    (paths.dir / "artifacts" / "calibration.json").write_text(json.dumps(
        {"run_id": held, "target_precision": 0.9, "schemas": {"sentiment": {"kept": True, "method": "platt"}}}))
    paths.predictions.write_text(run_paths(config, held).predictions.read_text().replace('"confidence": 0.9',
                                                                                         '"confidence": 0.6'))
    log = Log()
    calibration.apply(SimpleNamespace(config=config, store=store, run_id=calibrating.id, run=calibrating,
                                      bundle_dir=bundle, artifacts_dir=paths.dir / "artifacts", paths=paths,
                                      run_dir=paths.dir, log=log))
    assert ("info", f"Writeback of sentiment left as it is: the quality gate held run {held}'s predictions back "
                    f"({quality_gate.held_back(run_paths(config, held))[0]['text']})") in log.lines
    assert writeback_path(config).read_bytes() == written and live_runs_by_schema(config) == {"sentiment": good}


def test_answers_any_json_string_can_carry_survive_the_verdict_and_its_file(project):
    config = load_config(project)
    odd = "\ud800 lone, \x00 nul, " + "x" * 50  # a lone surrogate and a NUL, as an annotator's text may hold
    _labels_file(run_paths(config, 9).labels, [{"id": f"t{k}\ud800", "schema": "x", "gold": [odd], "holdout": False}
                                               for k in range(3)]
                 + [{"id": f"h{k}\ud800", "schema": "x", "gold": [odd], "holdout": True, "text": "other"}
                    for k in range(8)])
    config = replace(config, model_training=replace(
        config.model_training, writeback=replace(config.model_training.writeback, schemas=("x",))))
    (verdict,) = quality_gate.judge(config, 9, {"x": "text"}, {"x": []})
    assert not verdict.written and f"always answering the commonest text, `{odd[:40]}`" in verdict.text
    quality_gate.save(run_paths(config, 9), [verdict])
    assert quality_gate.held_back(run_paths(config, 9))[0]["text"] == verdict.text
