"""DPO in hf-llm-finetune against TRL's ``DPOTrainer``: training pairs per second, peak memory, held-out agreement.

Both sides tune the same model (default: the tests' tiny Llama, its
byte-level BPE trained on these texts; ``--model DIR`` for a real one), its
base weights in 4-bit NF4 with bitsandbytes, with the same LoRA (r=8, alpha
16, every linear layer, no dropout: TRL's ``disable_dropout`` default), the
reference model by disabling the adapter (no second copy), the same pairs,
beta, epochs, batch, learning rate (linear decay, no warm-up), ``max_length``
and thread count. A pair is a customer's complaint (the prompt, in the chat
template) and two replies of long-tailed length (a word of remedy or of
brush-off among filler words: about 25 words for most, past 100 for a few),
the reply offering a remedy preferred by each of three annotators unless one's
choice is flipped (10 %). No reply is long enough to be cut by either side.

- **ours**: the real worker (``potato.training.worker.run``, in a process of
  its own) on a bundle of the pairs, ``objective: dpo`` with ``epochs`` set
  (so no validation share: every pair trains); pairs per second from the
  start of the schema's preference training (its first log line, before the
  base model's log-probabilities are computed) to the ``progress`` event of
  the last step, so the reference pass is counted; peak resident memory of
  the whole run (training and predicting); agreement with the held-out
  majority from its ``scores.json``;
- **TRL**: ``DPOTrainer`` with ``ref_model=None`` and the ``LoraConfig``
  (its reference: the adapter disabled), the pairs in conversational form
  (the majority's reply chosen), its defaults except what both must share —
  ``gradient_checkpointing`` off and fp32 on a CPU (its defaults, on and
  bf16, only slow it down here; bf16 on a GPU); its
  ``train_samples_per_second``, peak resident memory, and the agreement of
  its implicit rewards (beta times the log-probability of a reply with the
  adapter minus without) on the same held-out pairs;
- **SFT only** (once, agreement only): TRL's ``SFTTrainer`` on the prompts
  and the majority's replies, the same LoRA and schedule, judged the same
  way: what learning the chosen replies alone, without the rejected ones,
  teaches about preference.

TRL's default computes the reference log-probabilities at every step (one
more forward pass per batch); ``--trl-precompute`` sets its
``precompute_ref_log_probs=True``, which computes them once before training,
as ours does, to show what the rest of the difference is. Rounds alternate
which side goes first; the ratio printed is the median of the rounds'.
Targets: >= 1.3x TRL's pairs/s, peak RSS no higher, agreement no lower.

Measured on this project's 2-core CPU machine (AVX512-BF16), 2 threads, the
defaults (200 training / 100 held-out pairs, 3 epochs, batch 8, lr 3e-3,
max_length 512; reply words: median 24, 90th percentile 67, longest 121):
ours 207.8 against 82.1 pairs/s, 2.54x (2.40-2.69 over 2 rounds); peak RSS
541 against 1160 MB; held-out agreement 0.81 against 0.78 (the base model:
0.49; SFT on the chosen replies alone: 0.51). ``--hidden 128 --layers 4``: 84.2 against 33.4 pairs/s, 2.53x; 724
against 1180 MB; 0.85 against 0.79. ``--trl-precompute``: 244.2 against
132.4 pairs/s, 1.84x, and TRL's agreement falls to 0.63: its reference pass
runs the model in eval mode, which on such a CPU makes bitsandbytes repack
the 4-bit weights for an inference kernel autograd cannot go through, so the
gradient stops at every base layer from then on. Ours fell into the same
trap (0.62 agreement) until it kept the repacking off until the last
prediction (hf_llm_finetune's ``_cpu_inference_kernel``).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/dpo_throughput.py [--train 200] [--holdout 100] [--rounds 2]

Needs the ``bench`` extra (TRL): ``bash scripts/install.sh --bench``. Run by
hand; never part of CI's pass/fail.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import shutil
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

from bench._versus_trainer import thread_env  # noqa: E402
from potato.training.answer_kinds import majority_side  # noqa: E402
from tests.support.bundles import (  # noqa: E402
    BRUSH_OFFS,
    COMPARISON_ANSWERS,
    COMPARISON_SCHEMAS,
    COMPLAINTS,
    FILLER,
    REMEDIES,
)

SEED = 42
SCHEMA = "pref"
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
BETA = 0.1
MAX_FILLER = 120  # words: with max_length 512, no reply reaches ours' cap (half of max_length) or TRL's


def _reply(rng: random.Random, core: str) -> str:
    """A reply of long-tailed length: the median about 25 words, one in ten past 70, the longest ``MAX_FILLER``."""
    n = min(MAX_FILLER, int(rng.lognormvariate(3.2, 0.8)))
    words = [rng.choice(FILLER) for _ in range(n)]
    words.insert(rng.randrange(len(words) + 1), core)
    return " ".join(words)


def make_items(n_train: int, n_holdout: int, noise: float = 0.1) -> list:
    rng = random.Random(SEED)
    items = []
    for i in range(n_train + n_holdout):
        good, bad = _reply(rng, rng.choice(REMEDIES)), _reply(rng, rng.choice(BRUSH_OFFS))
        good_side = rng.choice("AB")
        counts = {"A": 0, "B": 0, "tie": 0}
        for _ in range(3):
            counts[good_side if rng.random() >= noise else "AB".replace(good_side, "")] += 1
        items.append({"id": "c{}".format(i), "text": rng.choice(COMPLAINTS),
                      "sides": {SCHEMA: [good, bad] if good_side == "A" else [bad, good]},
                      "labels": {SCHEMA: counts}, "holdout": i >= n_train})
    return items


def options_of(args) -> dict:
    return {"model": args.model, "load_in_4bit": True, "objective": "dpo", "beta": BETA, "epochs": args.epochs,
            "batch_size": args.batch_size, "learning_rate": args.learning_rate, "warmup": 0,
            "max_length": args.max_length, "seed": args.seed, "lora": LORA}


def write_inputs(work: Path, items: list, args) -> None:
    """The worker's job directory (for ours) and the items (for TRL)."""
    job = work / "job"
    bundle = job / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text(json.dumps({
        "format": 1, "schemas": COMPARISON_SCHEMAS, "id_key": "id", "text_key": "text",
        "answers": COMPARISON_ANSWERS}))
    with open(bundle / "items.jsonl", "w") as f:
        for item in items:
            f.write(json.dumps(item) + "\n")
    (job / "job.json").write_text(json.dumps({
        "run_id": 1, "trainer": "hf-llm-finetune", "schemas": [SCHEMA], "bundle": "bundle",
        "options": options_of(args), "device": "auto", "num_threads": args.threads, "include_unlabeled": False}))
    (work / "items.json").write_text(json.dumps(items))


def child(side: str, work: Path, args) -> dict:
    """Run one side in a fresh interpreter; returns its figures."""
    argv = [sys.executable, __file__, "--child", side, str(work), "--model", args.model, "--threads",
            str(args.threads), "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
            "--learning-rate", str(args.learning_rate), "--max-length", str(args.max_length), "--seed", str(args.seed)]
    if args.trl_precompute:
        argv.append("--trl-precompute")
    result = subprocess.run(argv, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), **thread_env(args.threads)))
    if result.returncode != 0:
        raise SystemExit("{} failed:\n{}".format(side, result.stderr[-3000:]))
    return json.loads(result.stdout.strip().splitlines()[-1])


def ours_in_this_process(work: Path) -> dict:
    from potato.training.events import read_events
    from potato.training.worker import run

    job = work / "job"
    for stale in ("events.jsonl", "exit_code", "predictions.jsonl", "scores.json", "artifacts"):
        shutil.rmtree(job / stale, ignore_errors=True) if stale == "artifacts" else (job / stale).unlink(missing_ok=True)
    code = run(str(job))
    if code != 0:
        raise SystemExit("the worker exited with {}: {}".format(code, (job / "events.jsonl").read_text()[-2000:]))
    events = read_events(str(job / "events.jsonl"))[0]
    start = next(e for e in events if e["type"] == "log" and "objective dpo" in e["message"])
    train = [e for e in events if e["type"] == "progress" and e["phase"] == "train"]
    n_train = sum(1 for it in json.loads((work / "items.json").read_text()) if not it["holdout"])
    scores = json.loads((job / "scores.json").read_text())[SCHEMA]
    model_line = next(e["message"] for e in events if e["type"] == "log" and e["message"].startswith("Model: "))
    return {"pairs_per_s": n_train * json.loads((job / "job.json").read_text())["options"]["epochs"]
            / (train[-1]["t"] - start["t"]),
            "agreement": scores["agreement"], "agreement_before": scores["agreement_before"],
            "peak_rss_mb": _peak_rss_mb(), "model_line": model_line}


def _conversation(item: dict) -> tuple:
    """``(prompt, chosen, rejected)`` messages: the majority's reply chosen."""
    a, b = item["sides"][SCHEMA]
    chosen_b = majority_side(item["labels"][SCHEMA]) == "B"
    prompt = [{"role": "user", "content": item["text"]}]
    return prompt, [{"role": "assistant", "content": b if chosen_b else a}], \
        [{"role": "assistant", "content": a if chosen_b else b}]


def _load_4bit(model_dir: str, threads: int):
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    torch.set_num_threads(threads)
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map={"": 0 if cuda else "cpu"},
                                                quantization_config=BitsAndBytesConfig(
                                                    load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                    bnb_4bit_compute_dtype=dtype, bnb_4bit_use_double_quant=True))


def _reply_logp(model, tokenizer, prompt: list, reply: list) -> float:
    """The sum of the reply's token log-probabilities after the prompt, tokenized as TRL tokenizes them."""
    import torch

    prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]
    full = tokenizer.apply_chat_template(prompt + reply, tokenize=True, return_dict=True)["input_ids"]
    ids = torch.tensor([full], device=model.device)
    logits = model(input_ids=ids).logits[0, :-1].float()
    logps = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    return float(logps[len(prompt_ids) - 1:].sum())


def trl_in_this_process(work: Path, args) -> dict:
    import pyarrow
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging
    from trl import DPOConfig, DPOTrainer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    cuda = torch.cuda.is_available()
    items = json.loads((work / "items.json").read_text())
    rows = [dict(zip(("prompt", "chosen", "rejected"), _conversation(it))) for it in items if not it["holdout"]]
    # A fingerprint of our own: datasets' own (a dill pickle of the table) fails on this pyarrow.
    data = Dataset(pyarrow.Table.from_pylist(rows), fingerprint="dpo-throughput")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    config = DPOConfig(
        output_dir=str(work / "trl-out"), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, lr_scheduler_type="linear", warmup_steps=0, seed=args.seed, beta=BETA,
        max_length=args.max_length, gradient_checkpointing=False, precompute_ref_log_probs=args.trl_precompute,
        save_strategy="no", report_to=[], logging_strategy="no", disable_tqdm=True, use_cpu=not cuda, bf16=cuda,
    )
    lora = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                      target_modules=LORA["target_modules"], task_type="CAUSAL_LM")
    trainer = DPOTrainer(model=_load_4bit(args.model, args.threads), ref_model=None, args=config, train_dataset=data,
                         processing_class=tokenizer, peft_config=lora)
    started = time.perf_counter()
    out = trainer.train()
    seconds = time.perf_counter() - started
    n_train = len(rows) * args.epochs
    return {"pairs_per_s": out.metrics["train_samples_per_second"],
            "pairs_per_s_wall": n_train / seconds,  # around train(): with a precomputed reference, its pass too
            "agreement": _held_out_agreement(trainer.model.eval(), tokenizer, items), "peak_rss_mb": _peak_rss_mb()}


def _held_out_agreement(model, tokenizer, items: list) -> float:
    """The share of held-out pairs whose majority's reply gains more log-probability from the adapter."""
    import torch

    agreed = decided = 0
    with torch.inference_mode():
        for item in (it for it in items if it["holdout"]):
            side = majority_side(item["labels"][SCHEMA])
            if side == "tie":
                continue
            prompt = [{"role": "user", "content": item["text"]}]
            replies = [[{"role": "assistant", "content": s}] for s in item["sides"][SCHEMA]]
            tuned = [_reply_logp(model, tokenizer, prompt, r) for r in replies]
            with model.disable_adapter():
                base = [_reply_logp(model, tokenizer, prompt, r) for r in replies]
            gap = (tuned[1] - base[1]) - (tuned[0] - base[0])
            decided += 1
            agreed += ("B" if gap >= 0 else "A") == side
    return round(agreed / decided, 4)


def sft_in_this_process(work: Path, args) -> dict:
    """The SFT-only baseline: TRL's ``SFTTrainer`` on the majority's replies alone, the same LoRA and schedule."""
    import pyarrow
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging
    from trl import SFTConfig, SFTTrainer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    cuda = torch.cuda.is_available()
    items = json.loads((work / "items.json").read_text())
    rows = [dict(zip(("prompt", "completion"), _conversation(it)[:2])) for it in items if not it["holdout"]]
    data = Dataset(pyarrow.Table.from_pylist(rows), fingerprint="dpo-throughput-sft")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    config = SFTConfig(
        output_dir=str(work / "sft-out"), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, lr_scheduler_type="linear", warmup_steps=0, seed=args.seed,
        max_length=args.max_length, completion_only_loss=True, gradient_checkpointing=False,
        save_strategy="no", report_to=[], logging_strategy="no", disable_tqdm=True, use_cpu=not cuda, bf16=cuda,
    )
    lora = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                      target_modules=LORA["target_modules"], task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=_load_4bit(args.model, args.threads), args=config, train_dataset=data,
                         processing_class=tokenizer, peft_config=lora)
    trainer.train()
    return {"agreement": _held_out_agreement(trainer.model.eval(), tokenizer, items)}


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024.0 / (1024.0 if sys.platform == "darwin" else 1.0)


def build_model(directory: Path, items: list, hidden: int, layers: int) -> str:
    from tests.support.tiny_llm import build_tiny_causal_lm

    texts = [it["text"] for it in items] + [side for it in items for side in it["sides"][SCHEMA]]
    return str(build_tiny_causal_lm(directory, texts, "llama", vocab_size=2000, hidden=hidden, layers=layers))


def ratio(values: list) -> str:
    return "{:.2f}x (range {:.2f}-{:.2f} over {} rounds)".format(
        statistics.median(values), min(values), max(values), len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=200, help="training pairs")
    parser.add_argument("--holdout", type=int, default=100, help="held-out pairs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--trl-precompute", action="store_true",
                        help="TRL computes the reference log-probabilities once, before training")
    parser.add_argument("--model", default=None, help="causal LM directory (default: a tiny Llama built here)")
    parser.add_argument("--hidden", type=int, default=64, help="the tiny Llama's hidden size (the tests': 64)")
    parser.add_argument("--layers", type=int, default=2, help="the tiny Llama's layers (the tests': 2)")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "WORKDIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        side, work = args.child[0], Path(args.child[1])
        figures = {"ours": ours_in_this_process, "trl": lambda w: trl_in_this_process(w, args),
                   "sft": lambda w: sft_in_this_process(w, args)}[side](work)
        print(json.dumps(figures))
        return
    import torch

    items = make_items(args.train, args.holdout)
    lengths = sorted(len(side.split()) for it in items for side in it["sides"][SCHEMA])
    results = {"ours": [], "trl": [], "sft": []}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="potato-dpo-bench-") as tmp:
        if args.model is None:
            args.model = build_model(Path(tmp, "tiny-llama"), items, args.hidden, args.layers)
        where = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU, {} threads".format(args.threads)
        print("{} training / {} held-out pairs (reply words: median {}, 90th percentile {}, longest {}), {} epochs, "
              "batch {}, lr {:g}, beta {:g}, max_length {}, TRL reference {}, torch {} on {}, model {}".format(
                  args.train, args.holdout, lengths[len(lengths) // 2], lengths[math.floor(0.9 * len(lengths))],
                  lengths[-1], args.epochs, args.batch_size, args.learning_rate, BETA, args.max_length,
                  "precomputed" if args.trl_precompute else "at every step (its default)", torch.__version__, where,
                  args.model), flush=True)
        if hasattr(os, "getloadavg"):
            print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
        for r in range(args.rounds):
            work = Path(tmp, "round-{}".format(r))
            write_inputs(work, items, args)
            sides = ["ours", "trl"] if r % 2 == 0 else ["trl", "ours"]
            for side in sides + (["sft"] if r == 0 else []):  # the SFT baseline's agreement, once
                figures = child(side, work, args)
                results[side].append(figures)
                print("round {} {:5}: {}".format(r + 1, side, json.dumps(
                    {k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items() if k != "model_line"})),
                    flush=True)
    ours, trl = results["ours"], results["trl"]
    print("\n" + ours[0]["model_line"])
    print("training: ours {:.1f} pairs/s, TRL DPOTrainer {:.1f} pairs/s (medians); ratio {}".format(
        statistics.median(o["pairs_per_s"] for o in ours), statistics.median(t["pairs_per_s"] for t in trl),
        ratio([o["pairs_per_s"] / t["pairs_per_s"] for o, t in zip(ours, trl)])))
    print("peak RSS: ours {:.0f} MB (training and predicting), TRL {:.0f} MB (training) (max over rounds)".format(
        max(o["peak_rss_mb"] for o in ours), max(t["peak_rss_mb"] for t in trl)))
    print("held-out agreement: ours {} (the base model: {}), TRL {}; SFT on the chosen replies alone {}".format(
        ", ".join(str(o["agreement"]) for o in ours), ours[0]["agreement_before"],
        ", ".join(str(t["agreement"]) for t in trl), results["sft"][0]["agreement"]))
    print("\n{:.0f} s in all".format(time.monotonic() - started))


if __name__ == "__main__":
    main()
