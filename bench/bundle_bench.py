"""Benchmark: build (and pack) the run bundle for 100 k and 1 M items, ours against the baseline.

Run by hand (never part of CI's pass/fail)::

    .venv/bin/python bench/bundle_bench.py                      # 100k and 1M, 3 rounds each
    .venv/bin/python bench/bundle_bench.py --sizes 100000 --rounds 5
    .venv/bin/python bench/bundle_bench.py --baseline-ref main  # compare with another commit
    .venv/bin/python bench/bundle_bench.py --spans --baseline-ref ea3e26a  # votes and spans, one read

Each size: a project (3 annotators, about half the items labelled, Potato's
``indent=2`` user_state.json, one annotator in the older dict format) is
generated in a temp dir by one child process. Then, round after round, a
fresh interpreter builds the bundle with the baseline's ``potato`` package
(``git archive REF potato``, unpacked in a temp dir and first on that
interpreter's path, so both run on the same files, machine and load) and
another with ours, alternating. Each
reports its own wall and CPU seconds and peak RSS (``ru_maxrss`` after exec),
so sizes and the generator never pollute each other's figures. Both bundles'
``items.jsonl`` must be byte-identical, and the manifests equal.

Targets: 1 M items built in <= 4 s with peak RSS <= 300 MB,
100 k in <= 0.4 s. The machine may be shared: the load average is printed,
and CPU seconds are the figure that load disturbs least. Ours parses the
annotators' files in forked children only when the load average leaves a CPU
idle (``potato.annotations.labels._cpu_to_spare``); their CPU and peak RSS are printed
apart when they ran.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The commit before the bundle's speed work (14.1 s for 1 M items as filed).
DEFAULT_BASELINE = "263adad"


def _generate(project_dir: str, n_items: int, spans: bool) -> None:
    from tests.support.potato_project import make_project

    config_path = make_project(Path(project_dir), n_items=n_items, fmt=["pairs", "dict", "pairs"])
    if spans:
        _add_spans(config_path)


def _add_spans(config_path: Path) -> None:
    """A span schema beside the radio one: every labelled item gets a span from each of its annotators
    (as 2.12.1's page stores it), so the bundle reads votes and spans from the same files."""
    import yaml

    from tests.support.answer_project import span

    config = yaml.safe_load(config_path.read_text())
    config["annotation_schemes"].append({"annotation_type": "span", "name": "entities", "labels": ["PER", "LOC"]})
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    for state_path in (config_path.parent / "annotation_output").glob("*/user_state.json"):
        state = json.loads(state_path.read_text())
        labelled = state.get("instance_id_to_label_to_value") or {}
        state["instance_id_to_span_to_value"] = {item: [span("entities", ("PER", "LOC")[n % 2], 0, 6)]
                                                 for n, item in enumerate(labelled)}
        state_path.write_text(json.dumps(state, indent=2))


def _build(project_dir: str, dest: str, schemas: list[str]) -> None:
    # The baseline's child finds the baseline's own potato package first on its path: one from before the
    # folders (everything in potato/project.py) or after (potato/bundle/).
    try:
        from potato.bundle import build, pack
    except ImportError:
        from potato import project as build
        pack = build
    from tests.support.potato_project import project_config

    root = Path(project_dir)
    config = project_config(root / "config.yaml")
    t0, c0 = time.perf_counter(), time.process_time()
    info = build.build_bundle(config, schemas, Path(dest))
    t1, c1 = time.perf_counter(), time.process_time()
    pack.pack_bundle(dest, dest + ".tar.gz")
    t2 = time.perf_counter()
    items = Path(dest) / "items.jsonl"
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # potato.annotations.forked's, if the load left a CPU idle
    print(json.dumps({
        "items": info.items,
        "labeled": info.labeled["sentiment"],
        "build_s": t1 - t0,
        "build_cpu_s": c1 - c0,
        "children_cpu_s": children.ru_utime + children.ru_stime,
        "pack_s": t2 - t1,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "children_peak_rss_mb": children.ru_maxrss / 1024,
        "items_mb": items.stat().st_size / 2**20,
        "items_sha256": hashlib.sha256(items.read_bytes()).hexdigest(),
        "manifest": json.loads((Path(dest) / "manifest.json").read_text()),
    }))


def _child(*args: str, package: Path | None = None) -> dict:
    """Run this file's --child in a fresh interpreter; with *package*, that potato package is imported."""
    path = os.pathsep.join(str(p) for p in (package, ROOT) if p)
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": path}).stdout
    return json.loads(out.strip().splitlines()[-1])


def _same_manifest(base: dict, ours: dict) -> bool:
    """Equal but for keys the baseline's manifest had not yet (``answers`` came later)."""
    return base == {key: value for key, value in ours.items() if key in base}


def _spread(values: list[float]) -> str:
    return f"{min(values):6.2f} s (median {statistics.median(values):.2f}, max {max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-ref", default=DEFAULT_BASELINE)
    parser.add_argument("--spans", action="store_true",
                        help="add a span schema answered on every labelled item (votes and spans from the same "
                             "files; the baseline must know spans: pass --baseline-ref)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        action, *rest = args.child
        if action == "generate":
            _generate(rest[0], args.n, args.spans)
        else:
            _build(rest[0], rest[1], rest[2:])
        return

    with tempfile.TemporaryDirectory(prefix="bundle-bench-") as tmp:
        # The baseline's whole potato package (its project.py may import modules ours changed).
        baseline = Path(tmp) / "baseline"
        baseline.mkdir()
        archive = subprocess.run(["git", "archive", args.baseline_ref, "potato"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)
        print(f"baseline: the potato package at {args.baseline_ref}; load average {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} CPUs", flush=True)
        schemas = ["sentiment", "entities"] if args.spans else ["sentiment"]
        for n in args.sizes:
            project = Path(tmp) / f"project-{n}"
            t0 = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--child", "generate", str(project), "--n", str(n)]
                           + (["--spans"] if args.spans else []), check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            print(f"{n:,} items: project generated in {time.perf_counter() - t0:.0f} s", flush=True)
            results: dict[str, list[dict]] = {"baseline": [], "ours": []}
            for _ in range(args.rounds):
                for name, package in (("baseline", baseline), ("ours", None)):
                    results[name].append(_child("build", str(project), str(Path(tmp) / f"bundle-{name}"), *schemas,
                                                package=package))
            base, ours = results["baseline"], results["ours"]
            if base[-1]["items_sha256"] != ours[-1]["items_sha256"] or not _same_manifest(base[-1]["manifest"],
                                                                                          ours[-1]["manifest"]):
                sys.exit(f"{n:,} items: the bundles differ between the baseline and ours")
            for name, rows in results.items():
                forked = max(r.get("children_cpu_s", 0) for r in rows)
                print(f"  {name:8}  build {_spread([r['build_s'] for r in rows])}  "
                      f"cpu {_spread([r['build_cpu_s'] for r in rows])}  "
                      f"peak RSS {max(r['peak_rss_mb'] for r in rows):5.0f} MB  "
                      f"pack {min(r['pack_s'] for r in rows):5.2f} s", flush=True)
                if forked:
                    print(f"            forked children: cpu up to {forked:.2f} s, peak RSS "
                          f"{max(r['children_peak_rss_mb'] for r in rows):.0f} MB", flush=True)
            best = min(r["build_s"] for r in base) / min(r["build_s"] for r in ours)
            best_cpu = min(r["build_cpu_s"] for r in base) / min(r["build_cpu_s"] for r in ours)
            print(f"  ratio (baseline / ours, best of {args.rounds}): wall {best:.2f}x, cpu {best_cpu:.2f}x; "
                  f"items.jsonl {ours[-1]['items_mb']:.1f} MB, identical; load average now "
                  f"{os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
