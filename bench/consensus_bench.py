"""Benchmark: the bundle of 1 M items labelled by 3 annotators, aggregated by Dawid-Skene beside majority vote.

Run by hand (never part of CI's pass/fail)::

    .venv/bin/python bench/consensus_bench.py                    # 1 M items, 2 rounds
    .venv/bin/python bench/consensus_bench.py --items 100000 --rounds 3
    .venv/bin/python bench/consensus_bench.py --baseline-ref main --baseline-items 20000

A project is generated in a temp dir: items labelled by three annotators in
Potato's ``indent=2`` user_state.json (two with 10 % noise on every item, one
with 30 % on two items in three, so that a third of the items have two
answers, which Dawid-Skene decides where they disagree). Then, round after round, a fresh interpreter builds the bundle
with ``aggregation: majority`` and another with ``aggregation: consensus``,
alternating, each reporting wall and CPU seconds for the whole bundle and
for the aggregation step alone, and peak RSS. Target: consensus at 1 M items
in <= 30 s on a 2-CPU machine.

``--baseline-ref`` also times that commit's ``potato.annotations.consensus.dawid_skene``
alone on ``--baseline-items`` items of the same kind (it grows with the
items; minutes per million as filed), beside ours on the same observations.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANNOTATORS = {"alice": 0.1, "bob": 0.1, "carol": 0.3}  # name -> how often they give the wrong label
LABELS = ("positive", "negative")


def _generate(root: Path, n: int) -> None:
    """Items r0… and three annotators who labelled all of them, as Potato writes user_state.json."""
    from tests.support.potato_project import make_project

    make_project(root, n_items=0, annotators=("alice",), user_labels={"alice": {}})
    rng = random.Random(0)
    truth = [rng.randrange(2) for _ in range(n)]
    with open(root / "data" / "reviews.json", "w") as out:
        for i in range(n):
            out.write(json.dumps({"id": f"r{i}", "text": f"review {i} says {LABELS[truth[i]]}"}) + "\n")
    for user, noise in ANNOTATORS.items():
        path = root / "annotation_output" / user / "user_state.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = {}
        for i, t in enumerate(truth):
            if user == "carol" and i % 3 == 0:
                continue  # a third of the items have two answers, which may disagree: the model decides those
            label = LABELS[1 - t if rng.random() < noise else t]
            entries[f"r{i}"] = [[{"schema": "sentiment", "name": label}, label]]
        path.write_text(json.dumps({"user_id": user, "instance_id_to_label_to_value": entries}, indent=2))


def _build(root: Path, aggregation: str) -> None:
    from potato.annotations import labels
    from potato.bundle import build
    from tests.support.potato_project import project_config

    config = project_config(root / "config.yaml", aggregation=aggregation)
    scheme = [config.scheme("sentiment")]
    votes = labels.read_votes(config.output_annotation_dir, scheme, per_user=aggregation == "consensus")
    t0, c0 = time.perf_counter(), time.process_time()
    aggregated = (labels.consensus_votes if aggregation == "consensus" else labels.aggregate_votes)(votes)
    step = (time.perf_counter() - t0, time.process_time() - c0)
    del votes, aggregated
    t0, c0 = time.perf_counter(), time.process_time()
    info = build.build_bundle(config, ["sentiment"], root / f"bundle-{aggregation}")
    print(json.dumps({
        "build_s": time.perf_counter() - t0, "build_cpu_s": time.process_time() - c0,
        "step_s": step[0], "step_cpu_s": step[1], "line": build.describe_bundle(info),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


def _dawid_skene_alone(n: int) -> None:
    """``dawid_skene`` of whichever potato package is first on the path, on *n* items like the project's."""
    from potato.annotations.consensus import dawid_skene

    rng = random.Random(1)
    observations = {}
    for i in range(n):
        t = rng.randrange(2)
        observations[i] = [(user, 1 - t if rng.random() < noise else t) for user, noise in ANNOTATORS.items()
                           if user != "carol" or i % 3]
    t0 = time.perf_counter()
    dawid_skene(observations)
    print(json.dumps({"s": time.perf_counter() - t0}))


def _child(*args: str, package: Path | None = None) -> dict:
    path = os.pathsep.join(str(p) for p in (package, ROOT) if p)
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": path}).stdout
    return json.loads(out.strip().splitlines()[-1])


def _best(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows]
    return f"{min(values):6.2f} s (median {statistics.median(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-ref", help="also time this commit's dawid_skene alone")
    parser.add_argument("--baseline-items", type=int, default=20_000)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        action, *rest = args.child
        if action == "generate":
            _generate(Path(rest[0]), int(rest[1]))
        elif action == "alone":
            _dawid_skene_alone(int(rest[0]))
        else:
            _build(Path(rest[0]), rest[1])
        return

    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory(prefix="consensus-bench-") as tmp:
        project = Path(tmp) / "project"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--child", "generate", str(project), str(args.items)], check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
        print(f"{args.items:,} items x {len(ANNOTATORS)} annotators generated in {time.perf_counter() - t0:.0f} s",
              flush=True)
        results: dict[str, list[dict]] = {"majority": [], "consensus": []}
        for _ in range(args.rounds):
            for aggregation in results:
                results[aggregation].append(_child("build", str(project), aggregation))
        for aggregation, rows in results.items():
            print(f"  {aggregation:9}  bundle {_best(rows, 'build_s')}  cpu {_best(rows, 'build_cpu_s')}  "
                  f"aggregation alone {_best(rows, 'step_s')} (cpu {_best(rows, 'step_cpu_s')})  peak RSS {max(r['peak_rss_mb'] for r in rows):5.0f} MB",
                  flush=True)
        print(f"  consensus / majority (bundle, best of {args.rounds}): "
              f"{min(r['build_s'] for r in results['consensus']) / min(r['build_s'] for r in results['majority']):.2f}x")
        print(f"  {results['consensus'][-1]['line']}")
        if args.baseline_ref:
            baseline = Path(tmp) / "baseline"
            baseline.mkdir()
            archive = subprocess.run(["git", "archive", args.baseline_ref, "potato"], cwd=ROOT, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)
            theirs = _child("alone", str(args.baseline_items), package=baseline)["s"]
            ours = _child("alone", str(args.baseline_items))["s"]
            print(f"  dawid_skene alone on {args.baseline_items:,} items: {args.baseline_ref} {theirs:.2f} s, "
                  f"ours {ours:.2f} s")
        print(f"load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
