"""The live writeback: predictions into the items' own records of a watched data_directory, and the retract.

Real files of the hostile kinds real projects have (tests/support/live_project.py),
the real bundle and writeback; no Potato 2.12 here (the end-to-end test,
tests/e2e/test_live_beside_potato212.py, shows the same files to it).
"""

from __future__ import annotations

import json
import os

import pytest
import yaml

from potato.bundle.build import build_bundle
from potato.config import load_config
from potato.errors import RetractError
from potato.items.live_items import TABLE_FILE
from potato.results.live_writeback import FROM_DATA_FILES, catch_up, publish, read_targets
from potato.results.retract import retract
from potato.results.writeback import read_report
from potato.runs.paths import open_store, run_paths
from potato.runs.store import SUCCEEDED
from potato.validate import format_report, validate_config_file
from tests.support.live_project import (
    ARRAY,
    CSV,
    ITEMS,
    JSONL,
    item_fields,
    load_with_slider,
    record_run,
    snapshot,
    tickets_config,
    write_hostile_directory,
)


def test_each_record_holds_what_the_writeback_file_holds_and_nothing_else_changes(tmp_path):
    config_path = tickets_config(tmp_path)
    tickets = tmp_path / "tickets"
    before = snapshot(tickets)
    tone = {i: ("angry", 0.9) for i, _ in ITEMS}
    tone["t5"] = ("calm", 0.4)  # below min_confidence
    config, _, (summary, live) = record_run(tmp_path, config_path, 1, tone, {"t4": 7.2, "t6": 3})

    targets = read_targets(config)
    assert item_fields(tickets) == {i: v for i, v in targets.items() if i not in ("t10", "t11")}  # CSV: none
    assert set(targets) == {f"t{i}" for i in range(2, 12)} - {"t5"}  # the leak guard and min_confidence
    assert targets["t4"] == {"tone": {"label": "angry", "confidence": 0.9, "run_id": 1}, "urgency": 7}
    assert live.files == {"tickets/a.jsonl": 4, "tickets/b.json": 3} and live.problems == [] and not live.error
    assert live.not_live == {TABLE_FILE: 2}
    assert live.describe().startswith(
        "Live writeback: 7 record(s) in 2 file(s) of tickets/ changed (tickets/a.jsonl 4, tickets/b.json 3) in ")
    assert live.describe().endswith(
        "Potato 2.12 shows them within 2 s (watch_poll_interval). Item(s) with predictions that cannot be shown "
        "live (they show once Potato 2.12 restarts, through pre_annotation.predictions_file): 2 a CSV or TSV "
        "file: Potato 2.12 reads each cell as text, never as the mapping it pre-fills from")
    after = snapshot(tickets)
    assert after[CSV] == before[CSV] and set(after) == set(before)  # no temporary left
    # One field added per record: take it out again and every byte is the original's, BOM and CRLF included.
    assert after[JSONL].startswith(b"\xef\xbb\xbf") and after[JSONL].count(b"\r\n") == 7
    assert b'"score": 1e5, "weight": 1.0' in after[JSONL] and b"\\ud83d" in after[JSONL]
    report = read_report(config, 1)
    assert report["items_prefilled"] == 9 and report["live"]["changed"] == 7 and report["run_id"] == 1
    assert summary.held_back == {"tone": {"trained_on": 2, "below_confidence": 1}}


def test_only_changed_files_are_rewritten_and_a_retract_brings_back_the_earlier_run(tmp_path):
    config_path = tickets_config(tmp_path)
    tickets = tmp_path / "tickets"
    original = snapshot(tickets)
    record_run(tmp_path, config_path, 1, {i: ("calm", 0.8) for i, _ in ITEMS})
    after_first = snapshot(tickets)
    array_stat = os.stat(tickets / ARRAY)
    # Run 2 trains another schema, predicted on one item of a.jsonl: b.json is not written (2.12 does not
    # re-read it), and the record of t2 keeps run 1's tone beside run 2's urgency.
    config, store, (_, live) = record_run(tmp_path, config_path, 2, {}, {"t2": 6}, schemas=("urgency",))
    assert live.files == {"tickets/a.jsonl": 1}
    assert os.stat(tickets / ARRAY).st_mtime_ns == array_stat.st_mtime_ns
    assert item_fields(tickets)["t2"] == {"tone": {"label": "calm", "confidence": 0.8, "run_id": 1}, "urgency": 6}

    config, store, _ = record_run(tmp_path, config_path, 3, {i: ("angry", 0.7) for i, _ in ITEMS}, schemas=("tone",))
    result = retract(config, store, 3)
    assert result.describe() == ("Run 3's predictions were retracted: annotators now see run 1's predictions of "
                                 "tone, within 2 s (watch_poll_interval)")
    assert store.get_run(3).retracted_at is not None
    assert "Run 3's predictions were retracted: annotators now see run 1's" in \
        run_paths(config, 3).run_log.read_text()
    assert retract(config, store, 3).describe() == "Run 3's predictions were already retracted; nothing changed"
    assert retract(config, store, 2).describe() == (
        "Run 2's predictions were retracted: annotators now see no predictions of urgency, within 2 s "
        "(watch_poll_interval)")
    assert snapshot(tickets) == after_first

    result = retract(config, store, 1)
    assert result.describe() == ("Run 1's predictions were retracted: annotators now see no predictions of tone, "
                                 "within 2 s (watch_poll_interval)")
    assert snapshot(tickets) == original  # every record its own bytes again
    assert read_targets(config) == {}


def test_a_retracted_run_replaced_by_a_newer_one_changes_nothing_annotators_see(tmp_path):
    config_path = tickets_config(tmp_path)
    record_run(tmp_path, config_path, 1, {"t4": ("calm", 0.8)})
    config, store, _ = record_run(tmp_path, config_path, 2, {"t4": ("angry", 0.8)})
    shown = snapshot(tmp_path / "tickets")
    assert retract(config, store, 1).describe() == (
        "Run 1's predictions were retracted; annotators saw none of them (a newer run's replaced them), so "
        "nothing they see changes")
    assert snapshot(tmp_path / "tickets") == shown
    # Run 1 is retracted for good: retracting run 2 leaves nothing, rather than bringing run 1 back.
    assert retract(config, store, 2).restored == {"tone": None}


def test_a_run_without_predictions_cannot_be_retracted(tmp_path):
    config = load_config(tickets_config(tmp_path))
    store = open_store(config)
    store.create_run("hf-text-classification", ["tone"], "local")
    store.update_run(1, state="failed")
    with pytest.raises(RetractError, match="^Run 1 has no predictions to retract: it failed$"):
        retract(config, store, 1)
    store.create_run("decision-calibrate", ["tone"], "local")
    store.update_run(2, state=SUCCEEDED)
    with pytest.raises(RetractError, match="it is a decision-calibrate run, whose calibration is in the "
                                           "predictions of the run it calibrated: retract that run"):
        retract(config, store, 2)


def test_under_model_review_an_item_below_min_confidence_holds_its_confidence_only(tmp_path):
    # Potato 2.12's own order (the lowest confidence first): no place is added (tests/unit/test_review_order.py).
    config_path = tickets_config(tmp_path, strategy="model_review", order="least-confidence")
    tone = {i: ("angry", 0.9 - int(i[1:]) * 0.05) for i, _ in ITEMS}  # t9: 0.45 and t8: 0.5…
    config, _, (summary, _) = record_run(tmp_path, config_path, 1, tone, {"t2": 4})
    fields = item_fields(tmp_path / "tickets")
    assert fields["t9"] == {"tone": {"confidence": pytest.approx(0.45), "run_id": 1}}  # ordered, pre-fills nothing
    assert fields["t8"]["tone"]["label"] == "angry"
    assert summary.confidence_only == {"tone": 3}  # t9, and t10, t11 in the CSV file (in the writeback file)
    assert "3 below min_confidence, 3 of them as their confidence only (model_review)" in summary.describe()
    report = read_report(config, 1)
    assert [(e["id"], round(e["confidence"], 2)) for e in report["least_certain"]][:4] == [
        ("t11", 0.35), ("t10", 0.4), ("t9", 0.45), ("t8", 0.5)]
    assert report["least_certain"][0]["predictions"] == {"tone": "held back (confidence 0.35)"}
    assert report["items_confidence_only"] == 3 and report["items_prefilled"] == 7


def test_a_slider_held_back_gets_no_confidence_it_would_show_as_text(tmp_path):
    config = load_with_slider(tickets_config(tmp_path, strategy="model_review"))
    store = open_store(config)
    store.create_run("hf-text-classification", ["urgency"], "local")
    build_bundle(config, ["urgency"], tmp_path / "bundle")
    predictions = tmp_path / "p.jsonl"
    predictions.write_text(json.dumps({"id": "t4", "schema": "urgency", "value": 3, "confidence": 0.1}) + "\n")
    summary, _ = publish(config, 1, ["urgency"], predictions, tmp_path / "bundle")
    assert summary.confidence_only == {} and "t4" not in item_fields(tmp_path / "tickets")


def test_a_record_holding_the_field_before_the_first_live_writeback_stops_it(tmp_path):
    config_path = tickets_config(tmp_path)
    jsonl = tmp_path / "tickets" / JSONL
    jsonl.write_bytes(jsonl.read_bytes().replace(b'"id":"t2",', b'"id":"t2","predictions":{"tone":"mine"},'))
    before = snapshot(tmp_path / "tickets")
    message = ("tickets/a.jsonl line 3: item 't2' already holds a field 'predictions' of its own, which the live "
               "writeback (model_training.writeback.live) would replace; set model_training.writeback.field and "
               "pre_annotation.field to a key the items do not use")
    report = validate_config_file(config_path, read_items=True)
    assert [(e.path, e.message) for e in report.errors] == [("model_training.writeback.live", message)]
    _, _, (_, live) = record_run(tmp_path, config_path, 1, {"t4": ("calm", 0.9)})
    assert live.error == message and live.describe() == (
        f"The live writeback was refused, and no record of tickets/ changed: {message}")
    assert snapshot(tmp_path / "tickets") == before


def test_items_potato_212_keeps_from_data_files_are_counted_not_written(tmp_path):
    config_path = tickets_config(tmp_path, data_files=True)
    _, _, (_, live) = record_run(tmp_path, config_path, 1, {"t3": ("calm", 0.9), "t4": ("calm", 0.9)})
    assert live.not_live == {FROM_DATA_FILES: 1} and live.files == {"tickets/a.jsonl": 1}
    assert set(item_fields(tmp_path / "tickets")) == {"t4"}


def test_a_file_another_program_changes_meanwhile_is_read_again(tmp_path, monkeypatch):
    import potato.results.live_writeback as live_writeback

    config_path = tickets_config(tmp_path)
    jsonl = tmp_path / "tickets" / JSONL
    real = live_writeback.parse_data_file
    appended = []

    def read_then_append(path, data, encoding):
        found = real(path, data, encoding)
        if path.name == JSONL and not appended:  # an import script appends an item as we rewrite
            with open(jsonl, "ab") as out:
                out.write(b'{"id": "t99", "text": "appended"}\r\n')
            appended.append(path)
        return found

    monkeypatch.setattr(live_writeback, "parse_data_file", read_then_append)
    _, _, (_, live) = record_run(tmp_path, config_path, 1, {"t4": ("calm", 0.9)})
    assert appended and live.files == {"tickets/a.jsonl": 1}
    assert jsonl.read_bytes().endswith(b'{"id": "t99", "text": "appended"}\r\n')


def test_potato_start_catches_the_records_up_after_a_writer_was_killed(tmp_path):
    config_path = tickets_config(tmp_path)
    config, _, _ = record_run(tmp_path, config_path, 1, {"t4": ("calm", 0.9), "t8": ("angry", 0.9)})
    shown = snapshot(tmp_path / "tickets")
    # A writer killed after the writeback file, before the records: they are as they were, beside a temporary.
    write_hostile_directory(tmp_path / "tickets", ITEMS)
    (tmp_path / "tickets" / f".{JSONL}.live-4242.tmp").write_bytes(b"half a file")
    said: list[str] = []
    catch_up(config, said.append)
    assert snapshot(tmp_path / "tickets") == shown  # the temporary is gone too
    assert len(said) == 1 and said[0].startswith(
        "Live writeback: 2 record(s) in 2 file(s) of tickets/ changed (tickets/a.jsonl 1, tickets/b.json 1) in ")
    catch_up(config, said.append)
    assert len(said) == 1  # nothing to catch up: nothing said


def test_potato_validate_says_what_is_on_and_what_potato_212_needs(tmp_path):
    config_path = tickets_config(tmp_path, strategy="model_review")
    raw = yaml.safe_load(config_path.read_text())
    text = format_report(validate_config_file(config_path))
    assert text.splitlines()[0] == (
        "Live writeback: on. Each run's predictions go into the field 'predictions' of the items' own records in "
        "tickets/ (.json and .jsonl files; nothing else in them changes), and Potato 2.12 shows them within 2 s "
        "(watch_poll_interval); under assignment_strategy: model_review Potato 2.12 serves the items in the order "
        "'margin' ranks them, and an item below min_confidence holds its confidence only, pre-filling nothing")
    raw.pop("watch_data_directory")
    raw["pre_annotation"] = {"enabled": True, "predictions_file": "annotations/training/predictions.jsonl"}
    raw["model_training"]["writeback"]["include_unlabeled"] = False
    config_path.write_text(yaml.safe_dump(raw))
    warnings = {w.path: w.message for w in validate_config_file(config_path).warnings}
    assert warnings == {
        "watch_data_directory": "model_training.writeback.live is true, but watch_data_directory is not: Potato "
        "2.12 then reads data_directory only when it starts, so predictions reach annotators only after a restart; "
        "set watch_data_directory: true",
        "model_training.writeback.include_unlabeled": "assignment_strategy is model_review and "
        "model_training.writeback.include_unlabeled is false: Potato 2.12 serves only items that hold a "
        "prediction, so items nobody has labelled are never served; set include_unlabeled: true",
    }  # predictions_file is wanted: c.csv's items can get predictions only through it
    raw.pop("data_directory")
    raw["data_files"] = ["tickets/a.jsonl"]
    raw["pre_annotation"] = {"enabled": False}
    config_path.write_text(yaml.safe_dump(raw))
    report = validate_config_file(config_path)
    assert [e.message for e in report.errors] == [
        "model_training.writeback.live is true, but no item comes from a data_directory: Potato 2.12 changes a "
        "running item's data only for items of a watched data_directory. Move the items' files into a directory "
        "and set data_directory and watch_data_directory: true, or set live: false (annotators then see a new "
        "model after Potato 2.12 restarts)"]


def test_live_off_and_model_review_without_it_are_said_too(tmp_path):
    config_path = tickets_config(tmp_path, strategy="model_review", live=False)
    report = validate_config_file(config_path)
    assert format_report(report).splitlines()[-2] == (
        "Live writeback: off. Annotators see a new run's predictions after Potato 2.12 restarts; with "
        "model_training.writeback.live: true they go into the items' own records in tickets/ and show within "
        "watch_poll_interval")
    assert {w.path: w.message for w in report.warnings}["assignment_strategy"] == (
        "assignment_strategy is model_review: Potato 2.12 then serves only items whose own data holds a "
        "prediction, and never reads pre_annotation.predictions_file for it; set model_training.writeback.live: "
        "true (with a watched data_directory) so that annotators are served the items the model is least sure "
        "of first")


def test_the_page_the_api_and_the_command_retract_and_show_what_annotators_see(tmp_path):
    from click.testing import CliRunner

    from potato.cli import main
    from potato.server import create_app

    config_path = tickets_config(tmp_path, strategy="model_review", order="least-confidence")
    record_run(tmp_path, config_path, 1, {"t4": ("calm", 0.9), "t6": ("angry", 0.3)})
    config, store, _ = record_run(tmp_path, config_path, 2, {"t4": ("angry", 0.8), "t6": ("angry", 0.2)})
    client = create_app(config, store=store, start_background=False).test_client()
    key = {"X-API-Key": "k"}
    api = "/admin/training/api"

    shown = client.get(f"{api}/writeback", headers=key).json
    assert shown["run_id"] == 2 and shown["lines"][:2] == [
        "1 item(s) pre-filled; 1 item(s) hold their confidence only (below min_confidence: nothing pre-filled, "
        "served first under model_review)",
        "tone: 1 predictions written; held back: 1 below min_confidence"]
    assert shown["lines"][3].startswith("Live writeback: 2 record(s) in 1 file(s) of tickets/ changed")
    assert shown["least_certain"] == [  # each with its text, so that the reader need not look the id up
        {"id": "t6", "text": "ticket 6 café", "confidence": 0.2, "predictions": {"tone": "held back (confidence 0.20)"}},
        {"id": "t4", "text": "ticket 4 café", "confidence": 0.8, "predictions": {"tone": "angry (0.80)"}}]
    client.post("/admin/training/login", data={"api_key": "k"})
    page = client.get("/admin/training").get_data(as_text=True)
    assert "The predictions of run 2, the newest written back:" in page
    assert "<tr><td>t6</td><td>ticket 6 café</td><td>0.200</td><td>tone: held back (confidence 0.20)</td></tr>" in page
    run_page = client.get("/admin/training/runs/2").get_data(as_text=True)
    assert 'id="retract-button"' in run_page and f'data-api="{api}/runs/2/predictions"' in run_page

    assert client.get(f"{api}/runs/2", headers=key).json["run"]["retractable"] is True
    answer = client.delete(f"{api}/runs/2/predictions", headers=key)
    assert answer.status_code == 200 and answer.json["message"] == (
        "Run 2's predictions were retracted: annotators now see run 1's predictions of tone, within 2 s "
        "(watch_poll_interval)")
    assert answer.json["restored"] == {"tone": 1} and answer.json["run"]["retractable"] is False
    assert client.get(f"{api}/writeback", headers=key).json["run_id"] == 1  # a retracted run is not shown
    assert item_fields(tmp_path / "tickets")["t6"] == {"tone": {"confidence": 0.3, "run_id": 1}}
    # The page's own session needs the CSRF header for a DELETE, as for every change.
    assert client.delete(f"{api}/runs/1/predictions").status_code == 403

    store.create_run("hf-text-classification", ["tone"], "local")
    store.update_run(3, state="cancelled")
    refused = client.delete(f"{api}/runs/3/predictions", headers=key)
    assert refused.status_code == 409 and refused.json == {
        "error": "Run 3 has no predictions to retract: it cancelled"}
    assert client.delete(f"{api}/runs/99/predictions", headers=key).status_code == 404

    done = CliRunner().invoke(main, ["training", "retract", str(config_path), "1"])
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[0] == ("Run 1's predictions were retracted: annotators now see no predictions "
                                           "of tone, within 2 s (watch_poll_interval)")
    assert done.output.splitlines()[1].startswith("Live writeback: 2 record(s) in 1 file(s) of tickets/ changed")
    refused = CliRunner().invoke(main, ["training", "retract", str(config_path), "3"])
    assert refused.exit_code == 1 and refused.output == "Error: Run 3 has no predictions to retract: it cancelled\n"
