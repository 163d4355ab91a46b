"""Benchmark: writeback of 1 M predictions, ours against the writeback before the leak guard.

Run by hand (never part of CI's pass/fail)::

    .venv/bin/python bench/writeback_bench.py                 # 1M items
    .venv/bin/python bench/writeback_bench.py --items 100000

A bundle (``items.jsonl``, half the items labelled, 20 % of those held out)
and a run's ``predictions.jsonl`` for every item are generated in a temp dir.
Then two fresh interpreters write them back and report their own seconds and
peak RSS (``ru_maxrss``):

- baseline: ``potato/results/writeback.py`` as of commit 9907962 (one line per
  prediction, streamed; no leak guard, no checks), loaded from git;
- ours: ``potato.results.writeback.write_back`` (the bundle's ids and flags in memory,
  predictions in arrays, one record per item).

Ours keeps the item index the leak guard and the one-record-per-item shape
need, so it uses more memory; the target is 1 M items in well under 1 GB and
under a minute.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE_COMMIT = "9907962"


def _generate(tmp: Path, n: int) -> None:
    (tmp / "bundle").mkdir()
    manifest = {"format": 1, "schemas": {"sentiment": ["positive", "negative"]}}
    (tmp / "bundle" / "manifest.json").write_text(json.dumps(manifest))
    with open(tmp / "bundle" / "items.jsonl", "w") as items, open(tmp / "predictions.jsonl", "w") as preds:
        for i in range(n):
            labelled = i % 2 == 0
            record = {"id": f"r{i}", "text": f"review {i}", "labels": {"sentiment": "positive"} if labelled else {},
                      "holdout": labelled and i % 10 == 0}
            items.write(json.dumps(record) + "\n")
            preds.write(json.dumps({"id": f"r{i}", "schema": "sentiment", "label": "negative",
                                    "confidence": round(0.5 + (i % 50) / 100, 5)}) + "\n")


def _config(tmp: Path):
    from potato.config import WritebackConfig
    from tests.support.potato_project import make_project, project_config

    config = project_config(make_project(tmp / "project", n_items=1))
    wb = WritebackConfig(schemas=("sentiment",), include_unlabeled=True, min_confidence=0.6)
    return replace(config, model_training=replace(config.model_training, writeback=wb))


def _run(which: str, tmp: str) -> None:
    sys.path.insert(0, str(ROOT))
    tmp_path = Path(tmp)
    config = _config(tmp_path)
    started = time.perf_counter()
    if which == "ours":
        from potato.results.writeback import write_back

        write_back(config, 1, ["sentiment"], tmp_path / "predictions.jsonl", tmp_path / "bundle")
    else:
        import importlib.util

        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{BASELINE_COMMIT}:potato/results/writeback.py"],
                                capture_output=True, text=True, check=True).stdout
        (tmp_path / "old_writeback.py").write_text(source)
        spec = importlib.util.spec_from_file_location("old_writeback", tmp_path / "old_writeback.py")
        module = sys.modules["old_writeback"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.write_back(config, 1, tmp_path / "predictions.jsonl")
    seconds = time.perf_counter() - started
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_mb": rss_mb}))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _run(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        _generate(Path(tmp), args.items)
        results = {}
        for which in ("baseline", "ours"):
            for old in Path(tmp).glob("project/annotation_output/training/predictions.jsonl"):
                old.unlink()
            done = subprocess.run([sys.executable, __file__, "--child", which, tmp], capture_output=True,
                                  text=True, check=True)
            results[which] = json.loads(done.stdout.splitlines()[-1])
    base, ours = results["baseline"], results["ours"]
    print(f"{args.items:,} predictions")
    print(f"baseline ({BASELINE_COMMIT}): {base['seconds']:6.1f} s, peak {base['peak_mb']:6.0f} MB")
    print(f"ours:               {ours['seconds']:6.1f} s, peak {ours['peak_mb']:6.0f} MB "
          f"({ours['seconds'] / base['seconds']:.2f}x the time, {ours['peak_mb'] / base['peak_mb']:.2f}x the memory)")


if __name__ == "__main__":
    main()
