"""Every writer survives any string JSON can carry (a lone surrogate, a NUL, a 2 MB id), and messages quote ids short.

One helper, potato.training.escaping; here each writer that uses it: the run
log (store, run.log), the run store's columns, events.jsonl, items.jsonl and
labels.jsonl lines. The writeback, predictions.jsonl and the bundle have
their own tests (test_writeback.py, tests/integration/test_worker.py,
test_project.py).
"""

from __future__ import annotations

import json
import logging

import pytest

from potato.items.json_lines import dump_line, load_line
from potato.runs.runlog import RunLog
from potato.runs.store import Store
from potato.training.escaping import escaped, json_bytes, quote, quote_all
from potato.training.events import EventWriter, read_events

SURROGATE = "\ud83d"
HOSTILE = ["\ud83d", "nul\x00id", "x" * 2_000_000, "é\u2028\U0001f600"]


def test_an_id_is_quoted_escaped_and_cut_with_its_length():
    assert quote("r1") == "'r1'"
    assert quote(SURROGATE) == "'\\ud83d'"
    assert quote("a\x00b") == "'a\\x00b'"
    assert quote("x" * 200_000) == "'" + "x" * 80 + "…' (200000 characters)"
    assert quote(7) == "7" and quote([0] * 100) == "[" + "0, " * 26 + "0… (300 characters)"


def test_a_list_of_ids_shows_five_then_counts():
    assert quote_all(["a", "b"]) == "'a', 'b'"
    assert quote_all(map(str, range(12))) == "'0', '1', '2', '3', '4' and 7 more"
    assert quote_all(["a", "b"], total=9) == "'a', 'b' and 7 more"
    assert len(quote_all(["x" * 2_000_000] * 50)) < 600


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_text_always_encodes_and_json_lines_read_back_the_same(text):
    escaped(text).encode("utf-8")
    line = json_bytes({"id": text})
    line.decode("utf-8")
    assert json.loads(line) == {"id": text}
    assert load_line(dump_line({"id": text})) == {"id": text}


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_the_run_log_and_the_store_take_a_lone_surrogate(tmp_path):
    store = Store(tmp_path / "runs.db")
    run = store.create_run("hf-text-classification", ["sentiment"], "local")
    log = RunLog(store, run.id, tmp_path / "run.log")
    logger, seen = logging.getLogger("potato.run"), _Lines()
    logger.addHandler(seen)
    try:
        log.warning(f"label on {SURROGATE} ignored")
    finally:
        logger.removeHandler(seen)
    assert tmp_path.joinpath("run.log").read_text(encoding="utf-8").endswith(" WARNING label on \\ud83d ignored\n")
    assert [e.data["message"] for e in store.events(run.id)] == ["label on \\ud83d ignored"]
    assert seen.lines == ["label on \\ud83d ignored"]  # what Prefect's run logger gets, inside a flow
    store.update_run(run.id, error=f"Internal error: {SURROGATE}", step=SURROGATE)
    assert (store.get_run(run.id).error, store.get_run(run.id).step) == ("Internal error: \\ud83d", "\\ud83d")


def test_events_jsonl_takes_any_string_and_reads_it_back(tmp_path):
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path))
    for text in HOSTILE:
        writer.log(text, level="warning")
    writer.emit("done", status="succeeded")
    path.read_bytes().decode("utf-8")
    events, _ = read_events(str(path))
    assert [e["message"] for e in events if e["type"] == "log"] == HOSTILE
