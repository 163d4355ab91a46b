"""bench/gpu_check.sh --dry: the prepared GPU session's every step, on the CPU, so it cannot rot.

On a GPU machine the same script runs the same steps with MiniLM and real
numbers; here a tiny model and the fake nvidia-smi stand in (bench/gpu_check.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

pytestmark = [pytest.mark.training, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_runs_end_to_end_dry():
    done = subprocess.run(["bash", "bench/gpu_check.sh", "--dry"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, PYTHON=sys.executable))
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    assert "FAILED" not in out
    # 1: the probe read the (fake) nvidia-smi and the CPU torch's empty arch list, and said what a run would do.
    assert "GPU 0: NVIDIA H200, 143770 of 143771 MB free, 0% busy (torch there has no kernels for it)" in out
    assert "A run with gpus: auto could not start: This host's torch has no kernels for any of its GPUs" in out
    # 2: the kernel check and the precision on this machine.
    assert "device: auto picks cpu (CPU (" in out and "it trains with full precision (fp32)" in out
    # 3: the real worker, both kinds, on the example project's bundle, every prediction with its probs.
    for variant in ("full", "lora"):
        line = next(line for line in out.splitlines() if line.startswith(f"  {variant} on CPU ("))
        assert "320 predictions (320 with probs)" in line and "holdout {'accuracy': " in line
    # 4, 5 and 6: the benches against Trainer and pipeline printed their ratios.
    assert "lora " in out and "x (range " in out
    # 6: hf-llm-finetune with 4-bit base weights (bitsandbytes on the CPU here).
    assert "4-bit on cpu: bitsandbytes 0." in out
    assert "base weights in 4-bit NF4 (bitsandbytes), LoRA r=8 on 14 modules" in out
    assert "  hf-llm-finetune: " in out and " 320 predictions" in out
    assert "peak RSS: ours " in out
    assert "windows/s, holdout span F1 " in out
    assert out.rstrip().endswith("all steps OK")
