"""Benchmark: build and pack the run bundle for 100 k and 1 M items.

Run by hand (never part of CI's pass/fail)::

    .venv/bin/python bench/bundle_bench.py              # 100k and 1M
    .venv/bin/python bench/bundle_bench.py --sizes 100000

Each size: a project (3 annotators, about half the items labelled, Potato's
``indent=2`` user_state.json) is generated in a temp dir by one child process,
then a fresh interpreter builds and packs the bundle and reports its own
seconds and peak RSS (``ru_maxrss`` of RUSAGE_SELF after exec), so sizes and
the generator never pollute each other's figures. Target: 1 M items well under
60 s and under 1 GB.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _generate(project_dir: str, n_items: int) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.support.potato_project import make_project

    make_project(Path(project_dir), n_items=n_items, fmt=["pairs", "dict", "pairs"])


def _build(project_dir: str) -> None:
    sys.path.insert(0, str(ROOT))
    from potato.project import build_bundle, pack_bundle
    from tests.support.potato_project import project_config

    root = Path(project_dir)
    config = project_config(root / "config.yaml")
    t0 = time.perf_counter()
    info = build_bundle(config, ["sentiment"], root / "bundle")
    t1 = time.perf_counter()
    pack_bundle(root / "bundle", root / "bundle.tar.gz")
    t2 = time.perf_counter()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(
        json.dumps(
            {
                "items": info.items,
                "labeled": info.labeled["sentiment"],
                "build_s": round(t1 - t0, 2),
                "pack_s": round(t2 - t1, 2),
                "peak_rss_mb": round(peak_kb / 1024, 1),
                "bundle_mb": round(sum(p.stat().st_size for p in (root / "bundle").rglob("*") if p.is_file()) / 2**20, 1),
                "tar_gz_mb": round((root / "bundle.tar.gz").stat().st_size / 2**20, 1),
                "warnings": len(info.warnings),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--child", nargs=2, metavar=("ACTION", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        action, project_dir = args.child
        _generate(project_dir, args.n) if action == "generate" else _build(project_dir)
        return
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix=f"bundle-bench-{n}-") as tmp:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--child", "generate", tmp, "--n", str(n)], check=True)
            gen_s = time.perf_counter() - t0
            out = subprocess.run(
                [sys.executable, __file__, "--child", "build", tmp], check=True, capture_output=True, text=True
            ).stdout
            result = json.loads(out.strip().splitlines()[-1])
            print(
                f"{n:>9,} items  generate {gen_s:6.1f} s | build {result['build_s']:6.2f} s  "
                f"pack {result['pack_s']:5.2f} s  total {result['build_s'] + result['pack_s']:6.2f} s  "
                f"peak RSS {result['peak_rss_mb']:7.1f} MB  "
                f"(labelled {result['labeled']:,}; bundle {result['bundle_mb']} MB, tar.gz {result['tar_gz_mb']} MB)",
                flush=True,
            )


if __name__ == "__main__":
    main()
