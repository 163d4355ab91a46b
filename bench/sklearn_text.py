"""sklearn-text here against Potato 2.12.1's own sklearn-text, on the same labels, side by side.

    .venv/bin/python bench/sklearn_text.py [--items 10000] [--rounds 2]

Needs the real 2.12.1 (``bash scripts/install-potato212.sh``). One project —
reviews (bench/_reviews.py) with a ``radio`` sentiment schema, labelled by one
annotator in 2.12.1's own ``user_state.json`` format — is written twice, one
copy per server, with one config that both read: ``model_training`` with
``enabled: true`` and 2.12.1's ``splits`` (train 0.8, val 0, test 0.2) and
``split_seed``, so both hold out the same items (its ``test`` split) and
train on the same ones, with 2.12.1's default ``params``.

- 2.12.1: ``potato start`` in its own virtualenv, with its own training on;
  ``POST /admin/training/api/runs`` (``trainer: sklearn-text``), then its
  run record until it has finished. Its model is scored on the held-out
  items from its own predictions file (it predicts its val and test splits).
- ours: ``potato start`` here, with its embedded Prefect API; the same
  ``POST`` to our admin API, then the run until it has finished (bundle,
  Prefect flow, worker, writeback). Scored from our ``predictions.jsonl``
  on the same items with the same metric (``potato.training.trainers.metrics``).

Wall time is from the ``POST`` to the finished run as each server reports it
done (for ours that includes starting the run's Prefect flow process); the
training process's time is from its first event to its last (ours: the
worker; 2.12.1: its training subprocess). Rounds alternate which side goes
first (so a drift in the machine's load favours neither); the medians are
printed with the machine's load. Run by hand; never part of CI's pass/fail.

Measured on 2 cores shared with other work (load 3.6 to 9.6), 1 to 3 runs
of the bench per size; how many times as fast ours was (2.12.1's time over
ours), and the holdout macro-F1 of 2.12.1 and ours:

    items  request to finished run  training process  macro-F1 2.12.1 / ours
      600              0.57 - 0.88       1.13 - 1.74     0.9431 / 0.9714
     3000              0.85 - 1.15       1.55 - 2.44     0.9948 / 0.9948
    10000              1.22 - 1.28       1.79 - 2.00     0.9969 / 0.9969
    20000                     2.23              3.20     0.9979 / 0.9982

Our training process is faster at every size (the vectorizer is fitted once,
not in each calibration fold); a run here also starts its Prefect flow
process (1.5 to 3 s here, more on a loaded machine: imports are most of it),
which a small project's run does not win back.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bench._reviews import make_reviews  # noqa: E402
from potato.bundle.holdout import split_of  # noqa: E402
from potato.training.trainers import metrics  # noqa: E402
from tests.support.potato212 import VENV, Potato212Server  # noqa: E402
from tests.support.potato_project import write_items, write_user_state  # noqa: E402
from tests.support.runs import POTATO, free_port, stop_group, wait_for  # noqa: E402

KEY = "bench-key"
SPLITS = {"train": 0.8, "val": 0.0, "test": 0.2}
SEED = 0
LABELS = ["positive", "negative"]


def write_project(root: Path, reviews: list) -> Path:
    root.mkdir(parents=True)
    write_items(root / "data" / "reviews.jsonl", [{"id": r["id"], "text": r["text"]} for r in reviews])
    write_user_state(root / "annotation_output", "alice", {r["id"]: {"sentiment": r["label"]} for r in reviews})
    config = {
        "annotation_task_name": "sklearn-text bench",
        "task_dir": ".",
        "data_files": ["data/reviews.jsonl"],
        "item_properties": {"id_key": "id", "text_key": "text"},
        "output_annotation_dir": "annotation_output",
        "admin_api_key": KEY,
        "user_config": {"allow_all_users": True},
        "require_password": False,
        "annotation_schemes": [{"annotation_type": "radio", "name": "sentiment", "labels": LABELS,
                                "description": "Is this review positive or negative?"}],
        "model_training": {"enabled": True, "splits": SPLITS, "split_seed": SEED, "aggregation": "majority",
                           "max_wall_seconds": 1800, "writeback": {"schemas": ["sentiment"]}},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _call(url: str, method: str = "GET", body: dict | None = None) -> dict:
    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"X-API-Key": KEY, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{method} {url}: {exc.code} {exc.read()[:500]!r}") from None


def macro_f1(predicted: dict, gold: dict) -> tuple[float, int]:
    ids = sorted(gold)
    missing = [i for i in ids if i not in predicted]
    if missing:
        raise RuntimeError(f"{len(missing)} held-out items have no prediction, e.g. {missing[:3]}")
    return metrics.macro_f1([gold[i] for i in ids], [predicted[i] for i in ids]), len(ids)


def _span(times: list) -> float:
    return max(times) - min(times)


def run_212(server: Potato212Server, project: Path, gold: dict) -> tuple[float, float, float]:
    started = time.perf_counter()
    answer = _call(server.url + "/admin/training/api/runs", "POST",
                   {"trainer": "sklearn-text", "schemas": ["sentiment"], "params": {}})
    run_id = answer["run_id"]

    def finished():
        run = _call(f"{server.url}/admin/training/api/runs/{run_id}")
        return run if run.get("status") in ("success", "error", "cancelled") else None

    run = wait_for(finished, 1800, f"2.12.1's run {run_id}", interval=0.05)
    wall = time.perf_counter() - started
    if run["status"] != "success":
        raise RuntimeError(f"2.12.1's run failed: {run.get('error')}")
    directory = project / "annotation_output" / "training" / "runs" / run_id
    predicted = {}
    for line in (directory / "artifacts" / "predictions.jsonl").read_text().splitlines():
        record = json.loads(line)
        predicted[record["instance_id"]] = record["payload"]["label"]
    # Its training process's own events (JSON lines on its stdout), first to last.
    process = _span([json.loads(line)["t"] for line in (directory / "stdout.log").read_text().splitlines()
                     if line.startswith("{") and '"t"' in line])
    return wall, macro_f1(predicted, gold)[0], process


def run_ours(url: str, project: Path, gold: dict) -> tuple[float, float, float]:
    started = time.perf_counter()
    run_id = _call(url + "/admin/training/api/runs", "POST",
                   {"trainer": "sklearn-text", "schemas": ["sentiment"], "backend": "local"})["run"]["id"]

    def finished():
        run = _call(f"{url}/admin/training/api/runs/{run_id}")["run"]
        return run if run["state"] in ("succeeded", "failed", "cancelled") else None

    run = wait_for(finished, 1800, f"our run {run_id}", interval=0.05)
    wall = time.perf_counter() - started
    if run["state"] != "succeeded":
        raise RuntimeError(f"our run failed: {run.get('error')}")
    directory = project / "annotation_output" / "training" / "runs" / str(run_id)
    predicted = {}
    for line in (directory / "predictions.jsonl").read_text().splitlines():
        record = json.loads(line)
        predicted[record["id"]] = record["label"]
    f1, _ = macro_f1(predicted, gold)
    if run["scores"]["sentiment"]["macro_f1"] != round(f1, 4):
        raise RuntimeError(f"our run's own score {run['scores']} differs from the bench's {f1:.4f}")
    # The worker's events, first to last.
    process = _span([json.loads(line)["t"] for line in (directory / "events.jsonl").read_text().splitlines()])
    return wall, f1, process


def start_ours(config: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = open(log, "ab")
    process = subprocess.Popen([POTATO, "start", str(config), "--port", str(port)], cwd=config.parent,
                               stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                               env=dict(os.environ, HF_HUB_OFFLINE="1"))
    out.close()

    def answers():
        if process.poll() is not None:
            raise RuntimeError(f"potato start exited: {log.read_text()[-2000:]}")
        try:
            _call(url + "/admin/training/api/runs")
            return True
        except (OSError, RuntimeError):
            return False

    wait_for(answers, 120, f"potato start to serve {url} (log: {log})")
    return process, url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the projects (their run logs) and say where")
    args = parser.parse_args()
    if not (VENV / "bin" / "potato").exists():
        print(f"Potato 2.12.1 is not installed in {VENV}: run bash scripts/install-potato212.sh")
        return 2
    reviews = make_reviews(args.items, seed=0)
    gold = {r["id"]: r["label"] for r in reviews if split_of(r["id"], SPLITS, SEED) == "test"}
    scratch = Path(tempfile.mkdtemp(prefix="potato-bench-sklearn-"))
    theirs: Potato212Server | None = None
    ours_process = None
    try:
        config_212 = write_project(scratch / "p212", reviews)
        config_ours = write_project(scratch / "ours", reviews)
        theirs = Potato212Server(VENV / "bin" / "potato", config_212, scratch / "p212.log").start()
        ours_process, url = start_ours(config_ours, scratch / "ours.log")
        results = {"2.12.1": [], "ours": []}
        for r in range(args.rounds):
            order = ("2.12.1", "ours") if r % 2 == 0 else ("ours", "2.12.1")
            for side in order:
                if side == "2.12.1":
                    results[side].append(run_212(theirs, scratch / "p212", gold))
                else:
                    results[side].append(run_ours(url, scratch / "ours", gold))
                wall, f1, process = results[side][-1]
                print(f"round {r + 1} {side:>6}: {wall:6.2f} s ({process:.2f} s in its training process), "
                      f"holdout macro-F1 {f1:.4f}", flush=True)
    finally:
        if theirs is not None:
            theirs.stop()
        if ours_process is not None:
            stop_group(ours_process, 20)
        if args.keep:
            print(f"projects kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    load = os.getloadavg()
    print(f"\n{args.items} reviews ({len(gold)} held out: 2.12.1's test split), {args.rounds} rounds, "
          f"load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"{'':8}{'wall s':>9}{'training process s':>20}{'holdout macro-F1':>18}   (medians)")
    median = {side: [statistics.median(r[k] for r in results[side]) for k in range(3)] for side in results}
    for side in ("2.12.1", "ours"):
        wall, f1, process = median[side]
        print(f"{side:8}{wall:9.2f}{process:20.2f}{f1:18.4f}")
    print(f"ours is {median['2.12.1'][0] / median['ours'][0]:.2f}x as fast as 2.12.1 from request to finished run "
          f"(target >= 1), its training process {median['2.12.1'][2] / median['ours'][2]:.2f}x; macro-F1 "
          f"{median['ours'][1] - median['2.12.1'][1]:+.4f} (target >= 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
