"""hf-llm-finetune against what a user would otherwise run: TRL's ``SFTTrainer``, and ``pipeline("text-generation")``.

All three sides use the same model (default: the tests' tiny Llama, its
byte-level BPE trained on these reviews; ``--model DIR`` for a real one),
base weights in 4-bit NF4 with bitsandbytes, the same reviews
(bench/_reviews.py: a few words to past 256 tokens, long-tailed), the same
prompts (the trainer's default template in the model's chat template), the
same LoRA (r=8, alpha 16, dropout 0.05, every linear layer), epochs, batch,
learning rate, ``max_length`` and thread count:

- **ours**: the real worker (``potato.training.worker.run``, in a process of
  its own) on a bundle of the training reviews plus ``--predict`` unlabelled
  ones: training examples per second from its events (the ``progress`` of
  step 0 to that of the last step), prediction items per second over the
  predict phase (label scoring), peak resident memory of the whole run;
- **TRL**: ``SFTTrainer`` on the same prompt-completion pairs in
  conversational form with ``completion_only_loss=True`` (the loss on the
  answer only, as ours), the model loaded in 4-bit and the same
  ``LoraConfig``, ``gradient_checkpointing`` off as ours (TRL's default is on),
  linear decay without warm-up as ours; its ``train_samples_per_second``
  and peak resident memory;
- **pipeline**: ``pipeline("text-generation")`` on the adapter ours just
  trained (``AutoPeftModelForCausalLM``, 4-bit base), batches of
  ``--batch-size`` left-padded prompts, greedy, ``max_new_tokens`` just
  enough for the longest label and its end; items per second around the
  call; each answer read as a label, and compared with ours' choice.

Rounds alternate which side goes first. Targets: training >= 1.3x TRL's
examples/s with peak RSS no higher; prediction >= 2x the pipeline's items/s
with the same labels chosen. The ratios printed are the medians of the
rounds' ratios, with their range.

    HF_HUB_OFFLINE=1 python bench/llm_throughput.py [--train 400] [--predict 400] [--rounds 2] [--threads 1]
    ... --hidden 128 --layers 4      # a larger tiny Llama (1.2 M parameters), where compute weighs more

Needs the ``bench`` extra (TRL): ``bash scripts/install.sh --bench``. On a
machine shared with other work the absolute figures swing; the ratios of one
round, measured minutes apart, swing less. Run by hand; never part of CI's
pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench import _llm_sides as sides  # noqa: E402
from bench._reviews import make_reviews  # noqa: E402

SEED = 42
LABELS = ["positive", "negative"]
LORA = {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": "all-linear"}
DESCRIPTION = "Is this review positive or negative?"


def make_items(n_train: int, n_predict: int) -> list:
    """Bundle items: ``n_train`` labelled reviews, then ``n_predict`` unlabelled ones."""
    reviews = make_reviews(n_train + n_predict, seed=SEED)
    return [{"id": r["id"], "text": r["text"], "labels": {"sentiment": r["label"]} if k < n_train else {},
             "holdout": False} for k, r in enumerate(reviews)]


def options_of(args) -> dict:
    return {"model": args.model, "load_in_4bit": True, "epochs": args.epochs, "batch_size": args.batch_size,
            "learning_rate": args.learning_rate, "max_length": args.max_length, "seed": args.seed, "lora": LORA}


def write_inputs(work: Path, items: list, args) -> None:
    """The worker's job directory (for ours) and the items (for the others)."""
    job = work / "job"
    bundle = job / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text(json.dumps({
        "format": 1, "schemas": {"sentiment": LABELS}, "id_key": "id", "text_key": "text",
        "answers": {"sentiment": {"type": "radio", "kind": "nominal", "description": DESCRIPTION}}}))
    with open(bundle / "items.jsonl", "w") as f:
        for item in items:
            f.write(json.dumps(item) + "\n")
    (job / "job.json").write_text(json.dumps({
        "run_id": 1, "trainer": "hf-llm-finetune", "schemas": ["sentiment"], "bundle": "bundle",
        "options": options_of(args), "device": "auto", "num_threads": args.threads, "include_unlabeled": True}))
    (work / "items.json").write_text(json.dumps(items))


def ours_in_this_process(work: Path) -> dict:
    job = work / "job"
    events, model_line = sides.run_worker(job)
    train = [e for e in events if e["type"] == "progress" and e["phase"] == "train"]
    predict = [e for e in events if e["type"] == "progress" and e["phase"] == "predict"]
    items = json.loads((work / "items.json").read_text())
    n_train = sum(1 for it in items if it["labels"])
    predicted = [json.loads(line) for line in open(job / "predictions.jsonl")]
    (work / "ours-labels.json").write_text(json.dumps({p["id"]: p["label"] for p in predicted}))
    return {
        "train_ex_per_s": n_train * json.loads((job / "job.json").read_text())["options"]["epochs"]
        / (train[-1]["t"] - train[0]["t"]),
        "items_per_s": len(predicted) / (predict[-1]["t"] - train[-1]["t"]),
        "peak_rss_mb": sides.peak_rss_mb(), "model_line": model_line,
    }


def _prompt_messages(text: str) -> list:
    from potato.training.trainers.llm_prompts import DEFAULT_TEMPLATES, fill

    return [{"role": "user", "content": fill(DEFAULT_TEMPLATES["nominal"], text, LABELS, DESCRIPTION)}]


def trl_in_this_process(work: Path, args) -> dict:
    items = [it for it in json.loads((work / "items.json").read_text()) if it["labels"]]
    rows = [{"prompt": _prompt_messages(it["text"]),
             "completion": [{"role": "assistant", "content": it["labels"]["sentiment"]}]} for it in items]
    out = sides.trl_sft_trainer(rows, work / "trl-out", args, LORA).train()
    return {"train_ex_per_s": out.metrics["train_samples_per_second"], "peak_rss_mb": sides.peak_rss_mb()}


def pipeline_in_this_process(work: Path, args) -> dict:
    from peft import PeftModel
    from transformers import AutoTokenizer, pipeline
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    adapter = work / "job" / "artifacts" / "sentiment"
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    tokenizer.padding_side = "left"  # batched generation with a decoder-only model
    model = PeftModel.from_pretrained(sides.load_4bit(args.model, args.threads), adapter)
    longest = max(len(tokenizer(label, add_special_tokens=False)["input_ids"]) for label in LABELS)
    generate = pipeline("text-generation", model=model, tokenizer=tokenizer)
    ours = json.loads((work / "ours-labels.json").read_text())
    items = [it for it in json.loads((work / "items.json").read_text()) if it["id"] in ours]
    prompts = [tokenizer.apply_chat_template(_prompt_messages(it["text"]), tokenize=False, add_generation_prompt=True)
               for it in items]
    started = time.perf_counter()
    results = generate(prompts, batch_size=args.batch_size, max_new_tokens=longest + 1, do_sample=False,
                       return_full_text=False)
    answers = [r[0]["generated_text"].strip() for r in results]
    seconds = time.perf_counter() - started
    same = sum(1 for it, answer in zip(items, answers) if answer == ours[it["id"]])
    return {"items_per_s": len(items) / seconds, "peak_rss_mb": sides.peak_rss_mb(), "same_labels": same,
            "items": len(items), "not_a_label": sum(1 for a in answers if a not in LABELS),
            "e.g.": sorted({a for a in answers if a not in LABELS})[:3]}


def build_model(directory: Path, items: list, hidden: int, layers: int) -> str:
    from tests.support.tiny_llm import build_tiny_causal_lm

    texts = [it["text"] for it in items] + [" ".join(LABELS) + " " + DESCRIPTION] * 20
    return str(build_tiny_causal_lm(directory, texts, "llama", vocab_size=4000 if hidden > 64 else 2000,
                                    hidden=hidden, layers=layers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=400, help="labelled reviews to train on")
    parser.add_argument("--predict", type=int, default=400, help="unlabelled reviews to predict")
    sides.add_arguments(parser, learning_rate=1e-2, max_length=256, seed=SEED)
    args = parser.parse_args()
    if args.child:
        side, work = args.child[0], Path(args.child[1])
        figures = {"ours": ours_in_this_process, "trl": lambda w: trl_in_this_process(w, args),
                   "pipeline": lambda w: pipeline_in_this_process(w, args)}[side](work)
        print(json.dumps(figures))
        return
    import torch

    items = make_items(args.train, args.predict)
    results = {"ours": [], "trl": [], "pipeline": []}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="potato-llm-bench-") as tmp:
        if args.model is None:
            args.model = build_model(Path(tmp, "tiny-llama"), items, args.hidden, args.layers)
        where = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU, {} threads".format(args.threads)
        print("{} training / {} unlabelled reviews, {} epochs, batch {}, max_length {}, torch {} on {}, model {}".format(
            args.train, args.predict, args.epochs, args.batch_size, args.max_length, torch.__version__, where,
            args.model), flush=True)
        if hasattr(os, "getloadavg"):
            print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
        for r in range(args.rounds):
            work = Path(tmp, "round-{}".format(r))
            write_inputs(work, items, args)
            # The pipeline needs the adapter ours trains, so ours comes first in its pair; TRL alternates.
            order = ["ours", "pipeline", "trl"] if r % 2 == 0 else ["trl", "ours", "pipeline"]
            for side in order:
                figures = sides.child(__file__, side, work, args)
                results[side].append(figures)
                print("round {} {:8}: {}".format(r + 1, side, json.dumps(
                    {k: round(v, 1) if isinstance(v, float) else v for k, v in figures.items() if k != "model_line"})),
                    flush=True)
    ours, trl, pipe = results["ours"], results["trl"], results["pipeline"]
    print("\n" + ours[0]["model_line"])
    print("training:   ours {:.1f} ex/s, TRL SFTTrainer {:.1f} ex/s (medians); ratio {}".format(
        statistics.median(o["train_ex_per_s"] for o in ours), statistics.median(t["train_ex_per_s"] for t in trl),
        sides.ratio([o["train_ex_per_s"] / t["train_ex_per_s"] for o, t in zip(ours, trl)])))
    print("            peak RSS: ours {:.0f} MB (training and predicting), TRL {:.0f} MB (training) (max over rounds)"
          .format(max(o["peak_rss_mb"] for o in ours), max(t["peak_rss_mb"] for t in trl)))
    print("prediction: ours {:.1f} items/s, pipeline {:.1f} items/s (medians); ratio {}".format(
        statistics.median(o["items_per_s"] for o in ours), statistics.median(p["items_per_s"] for p in pipe),
        sides.ratio([o["items_per_s"] / p["items_per_s"] for o, p in zip(ours, pipe)])))
    print("            same label chosen: {} (answers that are no label: {})".format(
        ", ".join("{}/{}".format(p["same_labels"], p["items"]) for p in pipe),
        ", ".join(str(p["not_a_label"]) for p in pipe)))
    print("\n{:.0f} s in all".format(time.monotonic() - started))


if __name__ == "__main__":
    main()
