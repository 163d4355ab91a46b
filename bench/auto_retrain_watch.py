"""Benchmark: what the auto-retrain watcher costs, idle and beside a busy annotator, against the baseline.

Run by hand (never part of CI's pass/fail)::

    .venv/bin/python bench/auto_retrain_watch.py                       # both parts, baseline: main
    .venv/bin/python bench/auto_retrain_watch.py --seconds 60 --items 100000 --baseline-ref main

**Idle and one save** (20 annotators x 5 000 items, Potato's ``indent=2``
files, in one process): a poll that parses every file (what a watcher without
the stat cache does), ``AnnotationCounter.count()`` when nothing changed (a
``stat`` per file), and the same after one annotator's file was rewritten.

**A busy annotator** (target: <= 5 % of a core): one annotator with
``--items`` labelled items, their ``user_state.json`` as Potato 2.12 writes
it (``indent=2``, with the order each item's options were shown in: 25 MB at
100 k items), rewritten (a temporary file, then a rename) once a second, each time with one
more label, as a click does. For ``--seconds`` a fresh interpreter polls it
every 2 s (the watcher's ``POLL_SECONDS``) with the baseline's
``AnnotationCounter`` (``git archive REF potato``, first on its path), then
another with ours (counting only the project's items), both with the writer
running; each reports its CPU seconds over the wall seconds: the share of a
core the watcher took. The load average is printed: the machine may be
shared, and CPU seconds are what load disturbs least.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BASELINE = "main"
POLL_SECONDS = 2.0


def _labels(n: int) -> dict:
    return {f"r{i}": {"sentiment": ("positive", "negative")[i % 2]} for i in range(n)}


def _median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def idle_and_one_save(annotators: int, items: int, repeat: int) -> None:
    from potato.annotations.labels import count_user_state_annotations, find_user_states
    from potato.runs.auto_retrain import AnnotationCounter
    from tests.support.potato_project import write_user_state

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "annotation_output"
        for k in range(annotators):
            write_user_state(out, f"annotator{k}", _labels(items))
        size_mb = sum(p.stat().st_size for _, p in find_user_states(out)) / 1e6
        print(f"{annotators} annotators x {items} items: {size_mb:.1f} MB of user_state.json")

        def parse_all() -> int:
            return sum(count_user_state_annotations(p) for _, p in find_user_states(out))

        baseline = _median_seconds(parse_all, repeat)
        counter = AnnotationCounter(out)
        assert counter.count() == parse_all()
        idle = _median_seconds(counter.count, repeat)

        def one_save() -> None:
            one_save.n += 1
            write_user_state(out, "annotator0", _labels(items + one_save.n))
            counter.count()
        one_save.n = 0
        saved = _median_seconds(one_save, repeat)
        rewrite = _median_seconds(lambda: write_user_state(out, "annotator0", _labels(items)), repeat)
        saved = max(saved - rewrite, 1e-9)  # the poll's share, without writing the file

    print(f"  parse every file:       {baseline * 1000:9.2f} ms per poll")
    print(f"  ours, nothing changed:  {idle * 1000:9.2f} ms per poll   ({baseline / idle:,.0f}x cheaper)")
    print(f"  ours, one save:         {saved * 1000:9.2f} ms per poll   ({baseline / saved:,.1f}x cheaper)")


# -- a busy annotator ---------------------------------------------------------------------------------


def _state_text(n: int) -> str:
    """The busy annotator's file: labels, the order items were served in, and the order each schema's
    options were shown in (``instance_id_to_presentation_order``), as Potato 2.12's ``save`` writes them."""
    from tests.support.potato_project import user_state_dict

    state = user_state_dict("busy", _labels(n))
    state["instance_id_to_presentation_order"] = {f"r{i}": {"sentiment": ["positive", "negative"]} for i in range(n)}
    return json.dumps(state, indent=2)


class _Clicks(threading.Thread):
    """Rewrites the busy annotator's file once a second with one more label, as Potato 2.12 saves it."""

    def __init__(self, path: Path, items: int):
        super().__init__(daemon=True)
        self.path, self.items = path, items
        self.stop = threading.Event()
        text = _state_text(items)
        marker = '"instance_id_to_label_to_value": {\n'
        self.head, self.tail = text.split(marker, 1)
        self.head += marker
        self.clicks = 0

    def write(self) -> None:
        extra = "".join(f'    "extra{k}": [\n      [\n        {{\n          "schema": "sentiment",\n          '
                        f'"name": "positive"\n        }},\n        "positive"\n      ]\n    ],\n'
                        for k in range(self.clicks))
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(self.head + extra + self.tail)
        os.replace(tmp, self.path)

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.clicks += 1
            self.write()


def _watch(out: str, seconds: float, items: int, ours: bool) -> None:
    """In a child: poll like the watcher for *seconds*; print the CPU it took and what it counted."""
    from potato.runs.auto_retrain import AnnotationCounter

    ids = frozenset(f"r{i}" for i in range(items))
    counter = AnnotationCounter(Path(out), lambda: ids) if ours else AnnotationCounter(Path(out))
    started, cpu = time.perf_counter(), time.process_time()
    counts = []
    while time.perf_counter() - started < seconds:
        counts.append(counter.count())
        time.sleep(max(0.0, POLL_SECONDS - (time.perf_counter() - started) % POLL_SECONDS))
    wall, used = time.perf_counter() - started, time.process_time() - cpu
    print(json.dumps({"cpu_s": used, "wall_s": wall, "counts": counts, "parses": counter.parses}))


def busy_annotator(items: int, seconds: float, baseline_ref: str) -> None:
    with tempfile.TemporaryDirectory(prefix="watch-bench-") as tmp:
        baseline = Path(tmp) / "baseline"
        baseline.mkdir()
        archive = subprocess.run(["git", "archive", baseline_ref, "potato"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)
        out = Path(tmp) / "annotation_output"
        path = out / "busy" / "user_state.json"
        path.parent.mkdir(parents=True)
        clicks = _Clicks(path, items)
        clicks.write()
        print(f"a busy annotator: {items:,} items, {path.stat().st_size / 1e6:.0f} MB of user_state.json "
              f"rewritten every second; polled every {POLL_SECONDS:g} s for {seconds:g} s", flush=True)
        clicks.start()
        results = {}
        for name, package in (("baseline", baseline), ("ours", None)):
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (package, ROOT) if p)}
            done = subprocess.run([sys.executable, __file__, "--watch", str(out), str(seconds), str(items),
                                   "ours" if package is None else "baseline"], env=env, check=True,
                                  capture_output=True, text=True)
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        clicks.stop.set()
        clicks.join()
    for name, r in results.items():
        print(f"  {name:8}  {r['cpu_s']:6.2f} s of CPU in {r['wall_s']:5.1f} s = {100 * r['cpu_s'] / r['wall_s']:5.1f} % "
              f"of a core; {r['parses']} counts; last count {r['counts'][-1]:,}", flush=True)
    ratio = results["baseline"]["cpu_s"] / max(results["ours"]["cpu_s"], 1e-9)
    print(f"  baseline / ours: {ratio:.1f}x less CPU (target: ours <= 5 % of a core)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--annotators", type=int, default=20)
    parser.add_argument("--items-each", type=int, default=5000, help="idle part: items each annotator labelled")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--items", type=int, default=100_000, help="busy part: the busy annotator's items")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--baseline-ref", default=DEFAULT_BASELINE)
    parser.add_argument("--watch", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.watch:  # a child: the potato package its PYTHONPATH names first (the baseline's, or ours)
        out, seconds, items, which = args.watch
        _watch(out, float(seconds), int(items), which == "ours")
        return
    sys.path.insert(0, str(ROOT))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    idle_and_one_save(args.annotators, args.items_each, args.repeat)
    busy_annotator(args.items, args.seconds, args.baseline_ref)
    print(f"load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
