"""Benchmark: the Training page and ``GET runs`` with 10 000 runs in the store.

Run by hand (never part of CI's pass/fail)::

    .venv/bin/python bench/page_load.py
    .venv/bin/python bench/page_load.py --runs 10000 --requests 200 --server werkzeug

The server runs in its own process (bench/_server.py) on loopback; this
process sends sequential requests with the admin key and reports p50/p99/max
per URL. Target: every URL ≤ 200 ms.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STATES = ["succeeded"] * 6 + ["failed", "cancelled"]


def prepare(root: Path, n_runs: int, n_events: int) -> Path:
    """A project whose store holds *n_runs* runs (one running, two queued) and one run with *n_events* events."""
    from potato.config import load_config
    from potato.runs.paths import open_store
    from potato.runs.store import RUN_COLUMNS
    from tests.support.potato_project import make_project

    path = make_project(root, n_items=50, model_training={
        "enabled": True, "backends": {"gpu-server": {"type": "ssh", "host": "gpu.example.org"},
                                      "lab-workstation": {"type": "agent"}}})
    config = load_config(path)
    store = open_store(config)
    store.close()
    rng = random.Random(0)
    now = time.time()
    rows = []
    for i in range(1, n_runs + 1):
        state = "running" if i == n_runs - 2 else "queued" if i > n_runs - 2 else rng.choice(STATES)
        started = now - (n_runs - i) * 600
        scores = {"sentiment": {"accuracy": rng.random(), "macro_f1": rng.random(), "n": 48}} \
            if state == "succeeded" else {}
        rows.append({
            "id": i, "trainer": "hf-text-classification", "schemas": '["sentiment"]',
            "backend": rng.choice(["local", "gpu-server", "lab-workstation"]), "state": state,
            "step": "training: step 10 of 40" if state == "running" else "finished",
            "progress": 0.25 if state == "running" else None, "options": "{}",
            "created_at": started - 5, "started_at": None if state == "queued" else started,
            "finished_at": started + 300 if state not in ("queued", "running") else None,
            "scores": json.dumps(scores), "error": "Cancelled" if state == "cancelled" else None,
        })
    db = sqlite3.connect(config.training_dir / "runs.db")
    columns = [c for c in RUN_COLUMNS if c in rows[0]]
    db.executemany(f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
                   [tuple(r[c] for c in columns) for r in rows])
    db.executemany("INSERT INTO events (run_id, seq, t, kind, data) VALUES (?, ?, ?, ?, ?)",
                   [(n_runs - 2, s, now, "progress", json.dumps({"phase": "train", "step": s, "total": n_events,
                                                                   "loss": 1 / s})) for s in range(1, n_events + 1)])
    db.commit()
    db.close()
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(port: int, url: str, n: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", url, headers={"X-API-Key": "change-me"})
        response = conn.getresponse()
        body = response.read()
        times.append((time.perf_counter() - t0) * 1000)
        if response.status != 200:
            raise SystemExit(f"{url}: {response.status} {body[:200]!r}")
    conn.close()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--events", type=int, default=5000, help="events of the running run")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--server", default="waitress", choices=["waitress", "werkzeug", "gunicorn"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="potato-page-load-") as tmp:
        config = prepare(Path(tmp), args.runs, args.events)
        port = _free_port()
        server = subprocess.Popen([sys.executable, str(ROOT / "bench" / "_server.py"), str(config), str(port),
                                   args.server], stdout=subprocess.PIPE, text=True, start_new_session=True)
        worst = 0.0
        try:
            assert server.stdout.readline().strip() == "ready"
            time.sleep(0.5)
            running = args.runs - 2
            print(f"server: {args.server}; {args.runs} runs in the store, {args.events} events on run {running}; "
                  f"{args.requests} sequential requests per URL")
            for url in ("/admin/training", "/admin/training/api/runs", "/admin/training/api/runs?limit=500",
                        f"/admin/training/api/runs/{running}", f"/admin/training/api/runs/{running}?after={args.events - 5}",
                        f"/admin/training/runs/{running}"):
                measure(port, url, 3)  # warm up
                times = sorted(measure(port, url, args.requests))
                q = statistics.quantiles(times, n=100, method="inclusive")
                worst = max(worst, q[98])
                print(f"{url}: p50 {q[49]:.1f} ms, p99 {q[98]:.1f} ms, max {times[-1]:.1f} ms")
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(10)
    print(f"target <= 200 ms: {'met' if worst <= 200 else 'NOT met'} (worst p99 {worst:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
