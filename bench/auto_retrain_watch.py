"""Benchmark: what one poll of the auto-retrain watcher costs, against parsing every file each time.

Run by hand (never part of CI's pass/fail)::

    .venv/bin/python bench/auto_retrain_watch.py                      # 20 annotators x 5000 items
    .venv/bin/python bench/auto_retrain_watch.py --annotators 50 --items 20000

A project's annotators' ``user_state.json`` files (Potato's ``indent=2``
format) are generated in a temp dir. Then, in one process:

- baseline: count every file by parsing it (what a watcher without the stat
  cache does on every poll: ``count_user_state_annotations`` per file);
- ours, idle: ``AnnotationCounter.count()`` when nothing changed (a ``stat``
  per file);
- ours, one save: the same after one annotator's file was rewritten with one
  more label (one file parsed).

Each is the median of several polls; the ratios say how much cheaper a poll
is. The watcher polls every 2 s, so a poll must stay far below that.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from potato.auto_retrain import AnnotationCounter  # noqa: E402
from potato.labels import count_user_state_annotations, find_user_states  # noqa: E402
from tests.support.potato_project import write_user_state  # noqa: E402


def _labels(n: int) -> dict:
    return {f"r{i}": {"sentiment": ("positive", "negative")[i % 2]} for i in range(n)}


def _median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--annotators", type=int, default=20)
    parser.add_argument("--items", type=int, default=5000, help="items each annotator labelled")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "annotation_output"
        for k in range(args.annotators):
            write_user_state(out, f"annotator{k}", _labels(args.items))
        size_mb = sum(p.stat().st_size for _, p in find_user_states(out)) / 1e6
        print(f"{args.annotators} annotators x {args.items} items: {size_mb:.1f} MB of user_state.json")

        def parse_all() -> int:
            return sum(count_user_state_annotations(p) for _, p in find_user_states(out))

        baseline = _median_seconds(parse_all, args.repeat)
        counter = AnnotationCounter(out)
        assert counter.count() == parse_all()
        idle = _median_seconds(counter.count, args.repeat)

        def one_save() -> None:
            one_save.n += 1
            write_user_state(out, "annotator0", _labels(args.items + one_save.n))
            counter.count()
        one_save.n = 0
        saved = _median_seconds(one_save, args.repeat)
        rewrite = _median_seconds(lambda: write_user_state(out, "annotator0", _labels(args.items)), args.repeat)
        saved = max(saved - rewrite, 1e-9)  # the poll's share, without writing the file

    print(f"baseline (parse every file):  {baseline * 1000:9.2f} ms per poll")
    print(f"ours, nothing changed:        {idle * 1000:9.2f} ms per poll   ({baseline / idle:,.0f}x cheaper)")
    print(f"ours, one annotator saved:    {saved * 1000:9.2f} ms per poll   ({baseline / saved:,.1f}x cheaper)")


if __name__ == "__main__":
    main()
