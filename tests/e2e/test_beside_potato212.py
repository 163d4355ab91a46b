"""This project as the training half of a real Potato 2.12.1 deployment, step by step as
docs/beside-potato-2.12.md says.

One project directory and one config serve both: the real potato-annotation
2.12.1 (its own virtualenv, ``tests/support/potato212.py``) serves the
annotators, and this project's ``potato start`` runs beside it on another
port. Annotators label through 2.12.1's own HTTP endpoints; our watcher sees
their files and trains (trigger ``auto``); after 2.12.1 restarts, its
annotate page pre-fills our predicted label on an item nobody labelled and
nothing on an item the run trained on; five more annotations queue exactly
one more auto run, a sixth no second one. The project is made here (support
tickets, items in a ``data_directory``), not the shipped example.

Cost (measured on 2 cores): about 30 s — two 2.12.1 starts (~3 s each), one
``potato start``, one tiny-model training run (~15 s) and one run cancelled
at once — plus the session's Prefect API, shared with other tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from potato.bundle.holdout import split_of
from tests.support.potato212 import Annotator, OurServer, Potato212Server, project_config
from tests.support.runs import potato, processes_matching, wait_for
from tests.support.tiny_model import build_tiny_model

pytestmark = [pytest.mark.potato212, pytest.mark.prefect, pytest.mark.training]

CALM = ["Thanks, the new release works well.", "All good now, lovely support.", "Kind thanks for the quick fix."]
ANGRY = ["This is broken again, furious.", "Terrible service, still broken.", "Awful, nothing works, angry."]
SPLITS = {"train": 0.7, "val": 0.1, "test": 0.2}
SEED = 3
API_KEY = "tickets-admin"


def _tone(i: int) -> str:
    return ("calm", "angry")[i % 2]


def _tone_of(item: str) -> str:
    return _tone(int(item[1:]))


def _text(i: int) -> str:
    return f"{(CALM if _tone(i) == 'calm' else ANGRY)[i % 3]} (ticket {i})"


def _project(root: Path) -> Path:
    """30 support tickets in a data_directory (a JSON lines and a CSV file) and the shared config."""
    tickets = root / "tickets"
    tickets.mkdir(parents=True)
    with open(tickets / "a.jsonl", "w") as f:
        for i in range(20):
            f.write(json.dumps({"ticket_id": f"t{i:02d}", "body": _text(i)}) + "\n")
    with open(tickets / "b.csv", "w") as f:
        f.write("ticket_id,body\n" + "".join(f't{i:02d},"{_text(i)}"\n' for i in range(20, 30)))
    model = build_tiny_model(root / "tiny-model", [_text(i) for i in range(30)])
    config = {
        **project_config("Support tickets", "tickets", "ticket_id", "body", API_KEY),
        # docs/beside-potato-2.12.md's lines for Potato 2.12: it reads our predictions at its start.
        "pre_annotation": {"enabled": True, "predictions_file": "annotations/training/predictions.jsonl"},
        "model_training": {
            "enabled": False,  # Potato 2.12 does not train; this project does
            "split_seed": SEED,
            "splits": SPLITS,
            "backend": "lab-gpu",
            "backends": {"lab-gpu": {"type": "agent"}},
            "trainers": {"hf-text-classification": {"model": str(model), "max_length": 32}},
            # The gate off: a tiny model on 11 tickets may answer one tone for all; what is shown is the point here.
            "writeback": {"schemas": ["tone"], "include_unlabeled": True, "gate": False},
            "auto_retrain": {"enabled": True, "trainer": "hf-text-classification", "schemas": ["tone"],
                             "update_frequency": 5, "min_interval_s": 0, "backend": "local",
                             "params": {"epochs": 10, "learning_rate": 3e-3, "batch_size": 8}},
        },
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_training_beside_a_real_potato_212(potato212, prefect_api, tmp_path):
    config = _project(tmp_path)
    annotations = tmp_path / "annotations"
    potato_212 = Potato212Server(potato212, config, tmp_path / "potato212.log").start()
    ours = None
    try:
        # Potato 2.12 reads the shared config without training: no Training routes of its own.
        assert potato_212.status_of("/admin/training/api/status") == 404

        # 1. Annotators label through 2.12.1's own endpoints: alice 16 tickets, bob the first 8.
        alice, bob = Annotator(potato_212, "alice"), Annotator(potato_212, "bob")
        labelled = alice.label_in_turn("tone", 16, _tone_of)
        bob.label_in_turn("tone", 8, _tone_of)
        assert labelled == [f"t{i:02d}" for i in range(16)]  # data_directory order, as 2.12 serves it

        # 2. potato start beside it: the project never auto-trained, 24 annotations >= 5: one auto run at once.
        ours = OurServer(config, tmp_path / "potato-start.log", API_KEY)
        first = wait_for(lambda: ours.runs() and ours.runs()[-1], 30, "the first auto run")
        assert (first["id"], first["trigger"], first["backend"]) == (1, "auto", "local")
        done = wait_for(lambda: (r := ours.runs()[-1])["state"] in ("succeeded", "failed", "cancelled") and r,
                          240, "the first auto run to end")
        assert done["state"] == "succeeded", (tmp_path / "annotations/training/runs/1/run.log").read_text()
        held = [i for i in labelled if split_of(i, SPLITS, SEED) == "test"]
        run_log = (annotations / "training" / "runs" / "1" / "run.log").read_text()
        assert (f"Bundle: 30 items from 2 annotators; tone: 16 labelled (calm 8, angry 8; {len(held)} held out, "
                "0 ties)") in run_log
        records = [json.loads(line) for line in (annotations / "training" / "predictions.jsonl").read_text().splitlines()]
        written = {r["id"]: r["predictions"]["tone"] for r in records}
        trained = [i for i in labelled if i not in held]
        assert set(written) == {f"t{i:02d}" for i in range(30)} - set(trained)  # the leak guard

        # 3. Potato 2.12 reads predictions_file at its start: restart it, then a new annotator looks.
        potato_212.stop()
        potato_212.start()
        assert f"Loaded pre-annotations for {len(written)} item(s)" in (tmp_path / "potato212.log").read_text()
        carol = Annotator(potato_212, "carol")
        assert carol.checked(carol.go_to_item(trained[0]), "tone") == []  # trained on: no prelabel
        unlabelled = "t20"
        assert carol.checked(carol.go_to_item(unlabelled), "tone") == [written[unlabelled]["label"]]
        assert ours.watcher_saw(24)["since_last_auto_run"] == 0  # walking past items annotates nothing

        # 4. Five more annotations through the real server queue exactly one auto run; a sixth no second.
        carol.label_in_turn("tone", 4, _tone_of)
        assert ours.watcher_saw(28)["text"] == "waiting for 1 more annotation(s) (4 of 5 since the last automatic run)"
        assert len(ours.runs()) == 1
        carol.label("tone", _tone_of(carol.current()))
        second = wait_for(lambda: len(runs := ours.runs()) == 2 and runs[0], 30, "the second auto run")
        assert (second["trigger"], second["backend"]) == ("auto", "local")
        carol.next()
        carol.label("tone", _tone_of(carol.current()))
        status = ours.watcher_saw(30)
        assert status["since_last_auto_run"] == 1 and [r["id"] for r in ours.runs()] == [2, 1]
        ours.post("/runs/2/cancel")
        wait_for(lambda: ours.runs()[0]["state"] == "cancelled", 60, "run 2 to be cancelled")

        listed = potato("training", "runs", str(config)).stdout.splitlines()
        assert [line.split()[:4] for line in listed] == [
            ["ID", "STATE", "TRIGGER", "RAN"], ["2", "cancelled", "auto", "local"], ["1", "succeeded", "auto", "local"]]
        # Only this project trained: the run directories are ours.
        assert sorted(p.name for p in (annotations / "training" / "runs").iterdir()) == ["1", "2"]
    finally:
        if ours is not None:
            ours.stop()
        potato_212.stop()
    assert processes_matching(str(tmp_path)) == []
