"""kill -9 of ``potato start`` in the middle of a live writeback: every data file is as before or as after.

A real Potato 2.12.1 watches the project's data_directory (two JSON lines
files). The writeback file holds a prediction for every item and the records
none, so ``potato start`` catches the records up at its start; it is killed
with SIGKILL as soon as the temporary file of its second data file is seen:
the first file is rewritten, the second not yet. Each data file is then
byte-identical to what it was or to what the writeback makes of it, 2.12
keeps serving, and the next ``potato start`` removes the temporary and
finishes the writeback — the success line, not the refusal (a first
writeback cut short once made every later one refuse, "already holds a
field of its own") — which 2.12 then shows.

Cost (measured on 2 cores): about 17 s — one 2.12.1 start on 2 × 40 000 items
and two ``potato start`` — plus the session's Prefect API.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.support.potato212 import Annotator, OurServer, Potato212Server, project_config
from tests.support.runs import POTATO, free_port, processes_matching, wait_for

pytestmark = [pytest.mark.potato212, pytest.mark.prefect]

# Items per file: enough that a rewrite takes long enough to be caught in the middle.
ITEMS = 40_000
POLL_S = 1
API_KEY = "crash-admin"


def _project(root: Path) -> Path:
    items = root / "items"
    items.mkdir(parents=True)
    predictions = []
    for name in ("a", "b"):
        with open(items / f"{name}.jsonl", "w", encoding="utf-8", newline="") as f:
            for i in range(ITEMS):
                item = f"{name}{i:05d}"
                f.write(json.dumps({"id": item, "text": f"Ticket {i}: the printer on floor {i % 7} is out of toner."})
                        + "\r\n")
                predictions.append({"id": item, "predictions": {
                    "tone": {"label": "calm", "confidence": 0.9, "run_id": 1}}})
    training = root / "annotations" / "training"
    training.mkdir(parents=True)
    (training / "predictions.jsonl").write_text("".join(json.dumps(p) + "\n" for p in predictions))
    config = {
        **project_config("Printer tickets", "items", "id", "text", API_KEY),
        "watch_data_directory": True,
        "watch_poll_interval": POLL_S,
        "pre_annotation": {"enabled": True},
        "model_training": {"enabled": False,
                           "writeback": {"schemas": ["tone"], "include_unlabeled": True, "live": True}},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _temporaries(items: Path, of: str = "") -> list[str]:
    return [entry.name for entry in os.scandir(items) if entry.name.endswith(".tmp")
            and entry.name.startswith(f".{of}")]


def test_kill_9_in_the_middle_of_a_live_writeback(potato212, prefect_api, tmp_path):
    config = _project(tmp_path)
    items = tmp_path / "items"
    before = {p.name: p.read_bytes() for p in items.iterdir()}
    annotate = Potato212Server(potato212, config, tmp_path / "potato212.log").start()
    ours = None
    try:
        assert Annotator(annotate, "alice").current() == "a00000"

        # potato start catches the records up at its start; SIGKILL it the moment it begins the second file.
        with open(tmp_path / "killed.log", "wb") as log:
            killed = subprocess.Popen([POTATO, "start", str(config), "--port", str(free_port())], stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while not _temporaries(items, "b.jsonl"):
            assert killed.poll() is None, "potato start ended before the test saw its live writeback"
            assert time.monotonic() < deadline, "potato start never began a live writeback"
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(10)
        left = {p.name: p.read_bytes() for p in items.iterdir() if not p.name.endswith(".tmp")}
        assert _temporaries(items), "the kill came after the rewrite; nothing was cut short"
        assert left["a.jsonl"] != before["a.jsonl"] and left["b.jsonl"] == before["b.jsonl"]

        # 2.12 keeps serving.
        assert Annotator(annotate, "bob").current() == "a00000"

        # The next potato start removes the temporary and finishes the writeback; 2.12 shows it.
        ours = OurServer(config, tmp_path / "potato-start.log", API_KEY)
        assert _temporaries(items) == []
        after = {p.name: p.read_bytes() for p in items.iterdir()}
        said = (tmp_path / "potato-start.log").read_text()
        assert "The live writeback was refused" not in said
        assert "Live writeback: 40000 record(s) in 1 file(s) of items/ changed (items/b.jsonl 40000) in " in said
        assert after != before
        for name, data in left.items():
            assert data in (before[name], after[name]), f"{name} is neither as before nor as after"
        carol = Annotator(annotate, "carol")
        wait_for(lambda: carol.checked(carol.page(), "tone") == ["calm"], POLL_S + 5, "a00000 to be pre-filled")
        # Its directory watcher never read half a file.
        assert "Error processing file" not in (tmp_path / "potato212.log").read_text()
    finally:
        if ours is not None:
            ours.stop()
        annotate.stop()
    assert processes_matching(str(tmp_path)) == []
