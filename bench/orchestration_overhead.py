"""Orchestration overhead of a local run, against running the worker directly (issue: target ≤ 1.5 s added).

    .venv/bin/python bench/orchestration_overhead.py [--repeats 3]

Same job, same tiny model, in the same run of this script:

- baseline: ``python -m potato.training.worker JOB_DIR`` started directly;
  "start" = from starting it to its first event, "end" = from its last event
  to its exit;
- ours: ``potato training run CONFIG`` against a warm embedded Prefect API
  (started once, one warm-up run first); "start" = from starting the CLI to
  the worker's first event, "end" = from the worker's last event to the
  run's final state in the store.

Prints medians and the added seconds.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from potato.config import load_config  # noqa: E402
from potato.runs.prefect_api import start_embedded  # noqa: E402
from potato.runs.store import Store  # noqa: E402
from tests.support.runs import POTATO, tiny_project  # noqa: E402


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def baseline(config_yaml: Path, scratch: Path) -> tuple[float, float]:
    from potato.bundle.build import build_bundle
    from potato.runs.jobs import make_job, write_job

    cfg = load_config(config_yaml)
    store = Store(scratch / "baseline.db")
    run = store.create_run("hf-text-classification", ["sentiment"], "local", {})
    job_dir = scratch / f"job-{run.id}"
    build_bundle(cfg, ["sentiment"], job_dir / "bundle")
    write_job(job_dir, make_job(cfg, run, bundle=str(job_dir / "bundle")))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "potato.training.worker", str(job_dir)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t_exit = time.time()
    events = _events(job_dir / "events.jsonl")
    return events[0]["t"] - t0, t_exit - events[-1]["t"]


def ours(config_yaml: Path, run_id: int) -> tuple[float, float]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    t0 = time.time()
    subprocess.run([POTATO, "training", "run", str(config_yaml)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cfg = load_config(config_yaml)
    run = Store(cfg.training_dir / "runs.db").get_run(run_id)
    events = _events(cfg.training_dir / "runs" / str(run_id) / "events.jsonl")
    return events[0]["t"] - t0, run.finished_at - events[-1]["t"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="potato-bench-orch-"))
    try:
        config_yaml = tiny_project(scratch / "project", trainer={"epochs": 2})
        server = start_embedded(scratch / "prefect-home")
        try:
            ours(config_yaml, 1)  # warm-up: the flow, the concurrency limit, the DB
            base = [baseline(config_yaml, scratch) for _ in range(args.repeats)]
            mine = [ours(config_yaml, i + 2) for i in range(args.repeats)]
        finally:
            server.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    b_start, b_end = statistics.median(b[0] for b in base), statistics.median(b[1] for b in base)
    o_start, o_end = statistics.median(o[0] for o in mine), statistics.median(o[1] for o in mine)
    print(f"start → first worker event: worker alone {b_start:.2f} s, potato training run {o_start:.2f} s, "
          f"added {o_start - b_start:.2f} s")
    print(f"last worker event → end:    worker alone {b_end:.2f} s, potato training run {o_end:.2f} s, "
          f"added {o_end - b_end:.2f} s")
    print(f"total added: {(o_start - b_start) + (o_end - b_end):.2f} s (target: ≤ 1.5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
