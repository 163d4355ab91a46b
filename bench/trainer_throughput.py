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
all four, ours and the baseline alternating (bench/_versus_trainer.py: which
goes first alternates by round, so a drift in the machine's load favours
neither); the ratio printed is the median of the rounds' ratios, with their
range. Target: >= 1.3 with
holdout accuracy within 1 point of the baseline's.

    HF_HUB_OFFLINE=1 python bench/trainer_throughput.py [--train 400] [--holdout 1000] [--rounds 2]

On a machine shared with other work the absolute figures swing; the ratios of
one round, measured minutes apart, swing less. Run by hand (bench/gpu_check.sh
runs it on a GPU); never part of CI's pass/fail.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench import _versus_trainer as vs  # noqa: E402
from bench._reviews import make_reviews  # noqa: E402

LABELS = ["positive", "negative"]


def make_items(n_train: int, n_holdout: int) -> list:
    """Bundle items: the first ``n_train`` reviews train, the rest are held out (the same split for both)."""
    reviews = make_reviews(n_train + n_holdout, seed=vs.SEED)
    return [{"id": r["id"], "text": r["text"], "labels": {"sentiment": r["label"]}, "holdout": k >= n_train}
            for k, r in enumerate(reviews)]


def learning_rate(lora: bool) -> float:
    return vs.LORA_LR if lora else vs.FULL_LR


def run_ours(work: Path, items: list, args, lora: bool) -> dict:
    done = vs.run_worker(work, items, args.threads,
                         {"trainer": "hf-text-classification", "schemas": ["sentiment"],
                          "options": vs.options(args, lora, learning_rate(lora))},
                         {"schemas": {"sentiment": LABELS}})
    n_train = sum(1 for it in items if not it["holdout"])
    return {"ex_per_s": n_train * args.epochs / done["seconds"], "accuracy": done["scores"]["sentiment"]["accuracy"]}


def run_baseline(work: Path, items: list, args, lora: bool) -> dict:
    return vs.run_child(__file__, work, items, args, lora, [])


def baseline_in_this_process(items: list, args) -> dict:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer

    torch, cuda = vs.baseline_setup(args)
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    def dataset(rows):
        enc = tokenizer([it["text"] for it in rows], truncation=True, max_length=args.max_length)
        return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
                 "labels": LABELS.index(it["labels"]["sentiment"])} for i, it in enumerate(rows)]

    train, held = dataset([it for it in items if not it["holdout"]]), dataset([it for it in items if it["holdout"]])
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2, dtype=torch.float32)
    if args.lora:
        model = vs.lora_model(model, "SEQ_CLS")
    trainer = Trainer(model=model, args=vs.training_arguments(args, learning_rate(args.lora), cuda),
                      train_dataset=train, data_collator=DataCollatorWithPadding(tokenizer))
    out = trainer.train()
    predicted = trainer.predict(held)
    accuracy = float((predicted.predictions.argmax(-1) == predicted.label_ids).mean())
    return {"ex_per_s": out.metrics["train_samples_per_second"], "accuracy": round(accuracy, 4)}


def main() -> None:
    args = vs.parse(__doc__, 1000, baseline_in_this_process)
    if args is None:
        return
    items = make_items(args.train, args.holdout)
    print("{} training / {} held-out reviews, {} epochs, batch {}, max_length {}, {}, model {}".format(
        args.train, args.holdout, args.epochs, args.batch_size, args.max_length, vs.where(args), args.model),
        flush=True)
    vs.run_rounds(items, args, run_ours, run_baseline, "accuracy", "accuracy")


if __name__ == "__main__":
    main()
