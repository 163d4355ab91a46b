"""An item of 110 MB in a data file: ``potato start`` reads it, writes its predictions live, and keeps serving.

One record's text is 110 MB (a whole book pasted into a field, say). The
live writeback splices the predictions into it at ``potato start``'s
catch-up, keeping every other byte; the server answers meanwhile and after.
Before, the record reader's pattern for a JSON string kept the regular
expression engine's state per byte: 13 GB and three minutes for this one
item (a smaller machine kills the server).

Cost: about 30 s (writing and reading 2 × 110 MB, one ``potato start``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.live_project import written_back_project
from tests.support.potato212 import OurServer
from tests.support.runs import wait_for

pytestmark = [pytest.mark.prefect, pytest.mark.slow]

BIG = 110 * 1024 * 1024
PREDICTION = {"tone": {"label": "calm", "confidence": 0.9, "run_id": 1}}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_an_item_of_110_mb_is_written_back_live_and_potato_start_keeps_serving(prefect_api, tmp_path):
    config = written_back_project(tmp_path, {"a.jsonl": ["a0", "a1"]})
    big_text = "a very long review " * (BIG // 19)
    with open(tmp_path / "items" / "b.jsonl", "w", encoding="utf-8") as out:
        out.write(json.dumps({"id": "big", "text": big_text, "source": "book"}) + "\n")
        out.write(json.dumps({"id": "b1", "text": "a short one"}) + "\n")
    with open(tmp_path / "annotations" / "training" / "predictions.jsonl", "a", encoding="utf-8") as out:
        out.writelines(json.dumps({"id": i, "predictions": PREDICTION}) + "\n" for i in ("big", "b1"))

    server = OurServer(config, tmp_path / "potato-start.log", "k")
    try:
        line = wait_for(lambda: next((x for x in (tmp_path / "potato-start.log").read_text().splitlines()
                                      if "Live writeback: " in x), None), 120, "the catch-up's live writeback")
        assert "Live writeback: 4 record(s) in 2 file(s) of items/ changed (items/a.jsonl 2, items/b.jsonl 2)" in line
        assert server.get("/auto-retrain") is not None and server.process.poll() is None
        records = [json.loads(raw) for raw in (tmp_path / "items" / "b.jsonl").read_bytes().splitlines()]
        assert records[0] == {"id": "big", "text": big_text, "source": "book", "predictions": PREDICTION}
        assert _rss_mb(server.process.pid) < 2000, "the server's peak memory"
    finally:
        server.stop()
