"""bench/active_learning.py end to end on a generated corpus and the tiny model: every table it prints, the curves.

Not a measurement (the tiny model at the trainer's defaults learns little):
it proves the loop runs through the worker, the writeback's order, the cold
start and both baselines, and draws the curves (an SVG where matplotlib is
not installed). Cost: 46 s of CPU on 2 cores (5.5 min wall under a load of 12 from other work); marked slow.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.bundles import easy_review
from tests.support.tiny_model import tiny_model_path

pytestmark = [pytest.mark.training, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _tsv(path: Path, n: int, rng: random.Random) -> Path:
    rows = ["text\tlabel"] + [f"{easy_review(s, rng)}\t{s}" for s in ("positive", "negative") * (n // 2)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_the_bench_runs_every_strategy_start_and_baseline_and_draws_the_curves(tmp_path):
    rng = random.Random(3)
    train, _ = _tsv(tmp_path / "train.tsv", 80, rng), _tsv(tmp_path / "test.tsv", 20, rng)
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "active_learning.py"), "--data", str(train), "--pool", "30",
         "--seed-batch", "10", "--batch", "10", "--budget", "20", "--seeds", "1", "--strategies", "random,diverse",
         "--min-words", "3", "--model", str(tiny_model_path()), "--plot", str(tmp_path / "curves.png")],
        capture_output=True, text=True, timeout=600, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert out.splitlines()[1].startswith("Cost: 6 trainings (1 seeds x 2 starts x (1 shared round 0 + 1 rounds x "
                                          "2 strategies)), ")
    for start in ("random", "cold-start"):
        assert f"Accuracy on the test file per round ({start} seed batch), mean over seeds [0] [per seed]:" in out
        assert f"Area under the curve ({start} start; mean accuracy over 10..20 labels)" in out
    assert "  diverse           area " in out and "; area beats random's on " in out
    assert "reaches random's 20-label accuracy" in out
    table = out.split("The three trainers per budget on the random curve's labels")[1].splitlines()
    assert "tfidf+LR (sklearn-text)" in table[1] and "frozen MiniLM+LR" in table[1]
    assert [row.split()[0] for row in table[2:4]] == ["10", "20"]
    svg = (tmp_path / "curves.svg").read_text() if (tmp_path / "curves.svg").exists() else None
    assert f"Curves: {tmp_path / ('curves.svg' if svg else 'curves.png')}" in out
    if svg:
        assert svg.count("<polyline") == 6  # 2 strategies x 2 starts + the 2 baselines
