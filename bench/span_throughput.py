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
alternate which side goes first (bench/_versus_trainer.py); the ratio printed
is the median of the rounds'. Target: >= 1.3 with holdout F1 within 1 point
of the baseline's. A model must learn for F1 to say anything: on a CPU, 200
reviews, 4 epochs and ``--full-lr 3e-4`` reach about 0.98.

Measured on this project's 2-core CPU machine, 1 thread, load average 4-11
(``--train 200 --holdout 200 --epochs 4 --threads 1``, ``--full-lr 3e-4``,
``--lora-lr 6e-3``, 211 training windows): full fine-tune 4.4 against 1.2
windows/s, 3.88x (3.56-4.19 over 2 rounds), span F1 0.9838 against 0.9911;
LoRA 7.5 against 1.9, 3.83x (2.86-4.80), F1 0.9579 against 0.9662. The
Trainer pads each random batch to its longest review; ours pads length-grouped
batches.

    HF_HUB_OFFLINE=1 python bench/span_throughput.py [--train 400] [--holdout 400] [--rounds 2]

Run by hand (bench/gpu_check.sh can run it on a GPU); never part of CI's pass/fail.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench import _versus_trainer as vs  # noqa: E402
from bench._reviews import SPAN_LABELS, make_span_reviews  # noqa: E402
from potato.training.trainers import hf_span_tagging as st  # noqa: E402
from potato.training.trainers.metrics import holdout_scores  # noqa: E402

SCHEMA = "aspects"


def make_items(n_train: int, n_holdout: int) -> list:
    """Bundle items: the first ``n_train`` reviews train, the rest are held out (the same split for both)."""
    reviews = make_span_reviews(n_train + n_holdout, seed=vs.SEED)
    return [{"id": r["id"], "text": r["text"], "labels": {SCHEMA: r["spans"]}, "holdout": k >= n_train}
            for k, r in enumerate(reviews)]


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
    done = vs.run_worker(work, items, args.threads,
                         {"trainer": "hf-span-tagging", "schemas": [SCHEMA],
                          "options": vs.options(args, lora, learning_rate(args, lora), stride=args.stride)},
                         {"schemas": {SCHEMA: SPAN_LABELS}, "answers": {SCHEMA: {"type": "span", "kind": "span"}}})
    return {"ex_per_s": args.windows * args.epochs / done["seconds"], "f1": done["scores"][SCHEMA]["f1"]}


def run_baseline(work: Path, items: list, args, lora: bool) -> dict:
    return vs.run_child(__file__, work, items, args, lora, [
        "--stride", str(args.stride), "--full-lr", str(args.full_lr), "--lora-lr", str(args.lora_lr)])


def baseline_in_this_process(items: list, args) -> dict:
    from transformers import AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification, Trainer

    torch, cuda = vs.baseline_setup(args)
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
        model = vs.lora_model(model, "TOKEN_CLS")
    trainer = Trainer(model=model, args=vs.training_arguments(args, learning_rate(args, args.lora), cuda),
                      train_dataset=dataset(train_windows, train_tags),
                      data_collator=DataCollatorForTokenClassification(tokenizer))
    out = trainer.train()
    logits = trainer.predict(dataset(held_windows, held_tags)).predictions
    probs = torch.softmax(torch.tensor(logits, dtype=torch.float32), dim=-1)
    votes = [st.TokenVotes() for _ in held]
    for (n, ids, offsets), row in zip(held_windows, probs):
        prob, tag = row[:len(ids)].max(dim=-1)
        votes[n].add(offsets, tag.tolist(), prob.tolist())
    predicted = [[(s["start"], s["end"], s["label"]) for s in st.decode_spans(v.tokens(), SPAN_LABELS)]
                 for v in votes]
    gold = [st.gold_spans(it["labels"][SCHEMA], len(it["text"]), SPAN_LABELS)[0] for it in held]
    return {"ex_per_s": out.metrics["train_samples_per_second"], "f1": holdout_scores(gold, predicted, "span")["f1"]}


def more_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stride", type=int, default=None, help="default: a quarter of --max-length, as the trainer's")
    parser.add_argument("--full-lr", type=float, default=vs.FULL_LR, help="both sides' learning rate, full fine-tune")
    parser.add_argument("--lora-lr", type=float, default=vs.LORA_LR, help="both sides' learning rate, LoRA")


def settle_stride(args) -> None:
    if args.stride is None:
        args.stride = args.max_length // 4


def main() -> None:
    args = vs.parse(__doc__, 400, baseline_in_this_process, more_arguments, settle_stride)
    if args is None:
        return
    from transformers import AutoTokenizer

    items = make_items(args.train, args.holdout)
    _, windows, tags = examples(items, args, AutoTokenizer.from_pretrained(args.model), holdout=False)
    args.windows = len(windows)
    print("{} training reviews ({} windows, {} spans) / {} held out, {} epochs, batch {}, max_length {}, stride {}, "
          "learning rate {:g} full / {:g} LoRA, {}, model {}".format(
              args.train, len(windows), sum(1 for row in tags for t in row if t > 0 and t % 2 == 1), args.holdout,
              args.epochs, args.batch_size, args.max_length, args.stride, args.full_lr, args.lora_lr,
              vs.where(args), args.model), flush=True)
    vs.run_rounds(items, args, run_ours, run_baseline, "f1", "span F1", unit="windows/s")


if __name__ == "__main__":
    main()
