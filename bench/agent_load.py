"""Benchmark: the agent protocol's claim/poll and event-post routes under load.

Run by hand (never part of CI's pass/fail)::

    .venv/bin/python bench/agent_load.py                      # 60 s, waitress
    .venv/bin/python bench/agent_load.py --duration 20 --server werkzeug

The server runs in its own process (bench/_server.py, the app without Prefect
or the dispatcher) on loopback; this process is the load: ``--pollers`` agents
(default 100) each claiming once a second on an agent backend with nothing to
hand out, and ``--posters`` agents (default 20) each posting a batch with one
progress event ``--post-rate`` times a second (default 10) to its own claimed
run. Loops are bounded by ``--duration``; everything talks to 127.0.0.1 only.

Reports p50/p90/p99/max latency per route, the error count (must be 0), the
request rate and the server process's CPU (psutil). Target: p99 ≤ 25 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(root: Path, posters: int) -> tuple[Path, str, list[int]]:
    """A project with an agent backend, its token, and *posters* claimed running runs."""
    from potato.config import load_config
    from potato.runs.paths import open_store
    from potato.runs.tokens import register_agent
    from tests.support.potato_project import make_project

    path = make_project(root, n_items=50, model_training={
        "enabled": True, "backends": {"lab-workstation": {"type": "agent"}, "lab-idle": {"type": "agent"}}})
    config = load_config(path)
    store = open_store(config)
    token = register_agent(config, store, "lab-workstation")
    idle_token = register_agent(config, store, "lab-idle")
    run_ids = []
    for _ in range(posters):
        run = store.create_run("hf-text-classification", ["sentiment"], "lab-workstation")
        store.transition(run.id, "running", from_states="queued")
        store.add_event(run.id, "claimed", {"address": "127.0.0.1"})
        run_ids.append(run.id)
    store.close()
    return path, token + " " + idle_token, run_ids


class Conn:
    """One keep-alive HTTP/1.1 connection (a minimal client: the load must cost little)."""

    def __init__(self, port: int):
        self.port = port
        self.reader = self.writer = None

    async def request(self, method: str, path: str, token: str, body: bytes | None = None) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body or b'')}\r\n\r\n").encode()
        self.writer.write(head + (body or b""))
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("closed")
        status = int(status_line.split()[1])
        length, close = 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and value.strip().lower() == "close":
                close = True
        if length:
            await self.reader.readexactly(length)
        if close:
            self.writer.close()
            self.reader = self.writer = None
        return status


async def _agent(port, method, path, token, body_fn, interval, deadline, latencies, errors, start_delay):
    conn = Conn(port)
    await asyncio.sleep(start_delay)
    next_at = time.monotonic()
    n = 0
    while time.monotonic() < deadline:
        n += 1
        t0 = time.perf_counter()
        try:
            status = await conn.request(method, path, token, body_fn(n))
            if status != 200:
                errors.append(status)
        except Exception as exc:  # noqa: BLE001 - every failure counts as an error
            errors.append(repr(exc))
            conn = Conn(port)
        latencies.append((time.perf_counter() - t0) * 1000)
        next_at += interval
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def _summary(name: str, values: list[float], duration: float) -> str:
    if not values:
        return f"{name}: no requests"
    values = sorted(values)
    q = statistics.quantiles(values, n=100, method="inclusive")
    return (f"{name}: {len(values)} requests ({len(values) / duration:.0f}/s), p50 {q[49]:.1f} ms, "
            f"p90 {q[89]:.1f} ms, p99 {q[98]:.1f} ms, max {values[-1]:.1f} ms")


async def load(port, tokens, run_ids, args) -> dict:
    token, idle_token = tokens.split()
    deadline = time.monotonic() + args.duration
    poll_lat, post_lat, errors = [], [], []
    tasks = []
    for i in range(args.pollers):
        # Pollers of an idle agent backend: nothing to claim, the common case.
        tasks.append(_agent(port, "POST", "/training/agent/v1/backends/lab-idle/claim", idle_token,
                            lambda n: b"", 1.0, deadline, poll_lat, errors, i / args.pollers))
    for i, run_id in enumerate(run_ids):
        def body(n, run_id=run_id):
            event = {"seq": n, "t": time.time(), "type": "progress", "phase": "train",
                     "step": n, "total": 100000, "epoch": 1, "loss": 1.0 / n}
            return json.dumps({"events": [event]}).encode()
        tasks.append(_agent(port, "POST", f"/training/agent/v1/runs/{run_id}/events", token, body,
                            1.0 / args.post_rate, deadline, post_lat, errors, i / len(run_ids) / args.post_rate))
    await asyncio.gather(*tasks)
    return {"poll": poll_lat, "post": post_lat, "errors": errors}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--pollers", type=int, default=100)
    parser.add_argument("--posters", type=int, default=20)
    parser.add_argument("--post-rate", type=float, default=10.0)
    parser.add_argument("--server", default="waitress", choices=["waitress", "werkzeug", "gunicorn"])
    args = parser.parse_args()
    import psutil

    with tempfile.TemporaryDirectory(prefix="potato-agent-load-") as tmp:
        config, tokens, run_ids = prepare(Path(tmp), args.posters)
        port = _free_port()
        server = subprocess.Popen([sys.executable, str(ROOT / "bench" / "_server.py"), str(config), str(port),
                                   args.server], stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert server.stdout.readline().strip() == "ready"
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.1)
            proc = psutil.Process(server.pid)

            def cpu():
                total = sum(proc.cpu_times()[:2])
                for child in proc.children(recursive=True):
                    total += sum(child.cpu_times()[:2])
                return total

            cpu0, t0 = cpu(), time.monotonic()
            result = asyncio.run(load(port, tokens, run_ids, args))
            elapsed = time.monotonic() - t0
            cpu_s = cpu() - cpu0
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(10)
    print(f"server: {args.server}; {args.pollers} pollers at 1/s, {args.posters} posters at "
          f"{args.post_rate:g}/s, {elapsed:.0f} s on {os.cpu_count()} cores")
    print(_summary("claim (poll)", result["poll"], elapsed))
    print(_summary("post events", result["post"], elapsed))
    everything = result["poll"] + result["post"]
    print(_summary("all", everything, elapsed))
    print(f"errors: {len(result['errors'])}" + (f" (first: {result['errors'][:5]})" if result["errors"] else ""))
    print(f"server CPU: {cpu_s:.1f} s in {elapsed:.0f} s = {100 * cpu_s / elapsed:.0f}% of one core")
    p99 = statistics.quantiles(sorted(everything), n=100, method="inclusive")[98] if len(everything) > 1 else 0
    print(f"target p99 <= 25 ms: {'met' if p99 <= 25 and not result['errors'] else 'NOT met'} (p99 {p99:.1f} ms)")
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
