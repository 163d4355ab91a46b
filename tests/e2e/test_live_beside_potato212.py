"""Predictions reach annotators of a running Potato 2.12.1 without a restart, least-certain first, as
docs/beside-potato-2.12.md says.

Two real 2.12.1 servers on one project directory, each started once and
never restarted: the annotators' (``label.yaml``: the default assignment) and
the reviewers' (``config.yaml``, shared with this project's ``potato
start``: ``assignment_strategy: model_review``, which serves only items that
hold a prediction, so nobody could label the first items on it). Both watch
``data_directory``. Annotators label through 2.12.1's endpoints; ``potato
start`` beside it auto-retrains and writes each unlabelled item's prediction
into its own record (``model_training.writeback.live``); a brand-new
annotator's page pre-fills it within ``watch_poll_interval`` + 5 s of the
run's end (the latency is printed), never on an item the run trained on; a
brand-new reviewer is first served the item with the lowest confidence, which
is below ``min_confidence`` and so pre-fills nothing; a retract takes the
pre-fill away, live. The data files hold a CRLF file, non-ASCII text, a
U+2028, escapes, odd key orders and numbers such as ``1e5`` and ``1.0``: after
the retract every file is byte-identical to what it was, and so are the
annotators' ``user_state.json`` files.

Cost (measured on 2 cores): about 25 s — two 2.12.1 starts, one ``potato
start``, one tiny-model training run — plus the session's Prefect API.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tests.support.potato212 import Annotator, OurServer, Potato212Server, project_config
from tests.support.runs import potato, processes_matching, wait_for
from tests.support.tiny_model import build_tiny_model

pytestmark = [pytest.mark.potato212, pytest.mark.prefect, pytest.mark.training]

CALM = ["Thanks, the new release works well.", "All good now, lovely support.", "Kind thanks for the quick fix."]
ANGRY = ["This is broken again, furious.", "Terrible service, still broken.", "Awful, nothing works, angry."]
# Items nobody labels, in words no labelled item has: the model is least sure of them.
UNSEEN = ["Quarterly invoice attached for your records.", "Please update my postal address.",
          "Which plan includes extra seats?", "Meeting moved to Thursday afternoon."]
POLL_S = 1
API_KEY = "tickets-admin"
MIN_CONFIDENCE = 0.55  # the tiny model's calm tickets fall below it, its angry ones above


def _tone(i: int) -> str:
    return ("calm", "angry")[i % 2]


def _tone_of(item: str) -> str:
    return _tone(int(item[1:]))


def _text(i: int) -> str:
    if i >= 26:
        return f"{UNSEEN[i - 26]} (ticket {i})"
    return f"{(CALM if _tone(i) == 'calm' else ANGRY)[i % 3]} (ticket {i}, café \u2028 naïve)"


def _records() -> tuple[bytes, bytes]:
    """a.jsonl: tickets 0–19, CRLF, non-ASCII written raw (U+2028 escaped: 2.12.1 splits lines at a raw one);
    b.jsonl: 20–29, keys out of order, every non-ASCII character escaped, 1e5 and 1.0."""
    a = b"".join(json.dumps({"ticket_id": f"t{i:02d}", "body": _text(i), "weight": 1.0}, ensure_ascii=False)
                 .replace("\u2028", "\\u2028").encode() + b"\r\n" for i in range(20))
    b = b"".join(b'{"meta": {"seen": 1e5, "w": 1.0}, "body": ' + json.dumps(_text(i)).encode()
                 + b', "ticket_id": "t%02d"}\n' % i for i in range(20, 30))
    return a, b


def _configs(root: Path) -> tuple[Path, Path]:
    """config.yaml (this project and the reviewers' 2.12.1) and label.yaml (the annotators' 2.12.1)."""
    tickets = root / "tickets"
    tickets.mkdir(parents=True)
    a, b = _records()
    (tickets / "a.jsonl").write_bytes(a)
    (tickets / "b.jsonl").write_bytes(b)
    model = build_tiny_model(root / "tiny-model", [_text(i) for i in range(30)])
    config = {
        **project_config("Support tickets", "tickets", "ticket_id", "body", API_KEY),
        # docs/beside-potato-2.12.md's lines for a live writeback (step 5).
        "watch_data_directory": True,
        "watch_poll_interval": POLL_S,
        "assignment_strategy": "model_review",
        "pre_annotation": {"enabled": True},
        "model_training": {
            "enabled": False,
            "split_seed": 3,
            "splits": {"train": 0.7, "val": 0.1, "test": 0.2},
            "trainers": {"hf-text-classification": {"model": str(model), "max_length": 32}},
            # The gate off: a tiny model on 24 answers may give one label to every ticket, which the gate holds
            # back; this test follows predictions into the records (tests/e2e/test_gate_page.py is the gate's).
            "writeback": {"schemas": ["tone"], "include_unlabeled": True, "live": True,
                          "min_confidence": MIN_CONFIDENCE, "gate": False},
            "auto_retrain": {"enabled": True, "trainer": "hf-text-classification", "schemas": ["tone"],
                             "update_frequency": 5, "min_interval_s": 0, "backend": "local",
                             "params": {"epochs": 20, "learning_rate": 3e-3, "batch_size": 8}},
        },
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    label = root / "label.yaml"
    label.write_text(yaml.safe_dump({k: v for k, v in config.items() if k != "assignment_strategy"}, sort_keys=False))
    return path, label


def _written(root: Path) -> dict[str, dict]:
    lines = (root / "annotations" / "training" / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["id"]: r["predictions"]["tone"] for r in map(json.loads, lines)}


def test_predictions_reach_a_running_potato_212_live(potato212, prefect_api, tmp_path):
    config, label_config = _configs(tmp_path)
    tickets = tmp_path / "tickets"
    originals = {p.name: p.read_bytes() for p in tickets.iterdir()}
    checked = potato("validate", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert ("Live writeback: on. Each run's predictions go into the field 'predictions' of the items' own records "
            f"in tickets/ (.json and .jsonl files; nothing else in them changes), and Potato 2.12 shows them within "
            f"{POLL_S} s (watch_poll_interval); under assignment_strategy: model_review Potato 2.12 serves the "
            "items in the order 'margin' ranks them, and an item below min_confidence holds its confidence only, "
            "pre-filling nothing") in checked.stdout

    annotate = Potato212Server(potato212, label_config, tmp_path / "potato212-label.log").start()
    review = Potato212Server(potato212, config, tmp_path / "potato212-review.log").start()
    ours = None
    try:
        # Under model_review nothing holds a prediction yet: a reviewer is served nothing.
        assert Annotator(review, "early-reviewer").served() is None

        # Annotators label through 2.12.1's own endpoints: alice the first 16 tickets, bob the first 8.
        alice, bob = Annotator(annotate, "alice"), Annotator(annotate, "bob")
        labelled = alice.label_in_turn("tone", 16, _tone_of)
        bob.label_in_turn("tone", 8, _tone_of)
        states = {p: p.read_bytes() for p in (tmp_path / "annotations" / name / "user_state.json"
                                              for name in ("alice", "bob"))}

        # potato start beside them: 24 annotations, one auto run at once; its predictions go into the records.
        ours = OurServer(config, tmp_path / "potato-start.log", API_KEY)
        run = wait_for(lambda: (r := ours.runs()) and r[-1]["state"] in ("succeeded", "failed", "cancelled")
                       and r[-1], 240, "the first auto run to end")
        assert (run["trigger"], run["state"]) == ("auto", "succeeded"), \
            (tmp_path / "annotations/training/runs/1/run.log").read_text()
        written = _written(tmp_path)
        trained = [i for i in labelled if i not in written]
        assert trained, "the leak guard kept no labelled item back"
        unlabelled = {i: p for i, p in written.items() if i not in labelled}
        shown = sorted((i for i, p in unlabelled.items() if "label" in p), key=lambda i: -unlabelled[i]["confidence"])
        assert shown, f"no unlabelled item above min_confidence: {unlabelled}"
        run_log = (tmp_path / "annotations/training/runs/1/run.log").read_text()
        assert "Live writeback: " in run_log
        assert f"Potato 2.12 shows them within {POLL_S} s (watch_poll_interval)" in run_log

        # A brand-new annotator: nothing on an item the run trained on; our label on an unlabelled one, live.
        carol = Annotator(annotate, "carol")
        assert carol.checked(carol.go_to_item(trained[0]), "tone") == []
        target = shown[0]
        carol.go_to_item(target)
        deadline = run["finished_at"] + POLL_S + 5
        wait_for(lambda: carol.checked(carol.page(), "tone") == [unlabelled[target]["label"]],
                 max(deadline - time.time(), 0.1), f"{target} to be pre-filled with {unlabelled[target]}")
        print(f"\nlive writeback: {target} pre-filled for a new annotator {time.time() - run['finished_at']:.1f} s "
              f"after run 1 ended (watch_poll_interval {POLL_S} s)")

        # A brand-new reviewer is first served the item the model is least sure of (below min_confidence: no pre-fill).
        least = min(written, key=lambda i: written[i]["confidence"])
        assert "label" not in written[least], written[least]
        probes = iter(range(100))
        reviewer = wait_for(lambda: (a := Annotator(review, f"reviewer{next(probes)}")).served() == least and a,
                            POLL_S + 5, f"a new reviewer to be served {least} first")
        assert reviewer.checked(reviewer.page(), "tone") == []

        # Retract: the pre-fill goes, live, and every data file is its original bytes again.
        retracted = potato("training", "retract", str(config), "1")
        assert retracted.returncode == 0, retracted.stderr
        assert retracted.stdout.startswith("Run 1's predictions were retracted: annotators now see no predictions "
                                           f"of tone, within {POLL_S} s (watch_poll_interval)\n"), retracted.stdout
        assert {p.name: p.read_bytes() for p in tickets.iterdir()} == originals
        erin = Annotator(annotate, "erin")
        erin.go_to_item(target)
        wait_for(lambda: erin.checked(erin.page(), "tone") == [], POLL_S + 5, f"{target}'s pre-fill to go")
        late = iter(range(100))
        wait_for(lambda: Annotator(review, f"late-reviewer{next(late)}").served() is None, POLL_S + 5,
                 "a new reviewer to be served nothing")
        assert {p: p.read_bytes() for p in states} == states
    finally:
        if ours is not None:
            ours.stop()
        annotate.stop()
        review.stop()
    assert processes_matching(str(tmp_path)) == []
