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
from bench.reward_throughput import make_items  # noqa: E402
from potato.training.answer_kinds import majority_side  # noqa: E402
from tests.support.bundles import COMPARISON_ANSWERS, COMPARISON_SCHEMAS  # noqa: E402

SEED = 42
SCHEMA = "pref"
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
BETA = 0.1
MAX_FILLER = 120  # words: with max_length 512, no reply reaches ours' cap (half of max_length) or TRL's


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


def ours_in_this_process(work: Path) -> dict:
    job = work / "job"
    events, model_line = sides.run_worker(job)
    start = next(e for e in events if e["type"] == "log" and "objective dpo" in e["message"])
    train = [e for e in events if e["type"] == "progress" and e["phase"] == "train"]
    n_train = sum(1 for it in json.loads((work / "items.json").read_text()) if not it["holdout"])
    scores = json.loads((job / "scores.json").read_text())[SCHEMA]
    return {"pairs_per_s": n_train * json.loads((job / "job.json").read_text())["options"]["epochs"]
            / (train[-1]["t"] - start["t"]),
            "agreement": scores["agreement"], "agreement_before": scores["agreement_before"],
            "peak_rss_mb": sides.peak_rss_mb(), "model_line": model_line}


def _conversation(item: dict) -> tuple:
    """``(prompt, chosen, rejected)`` messages: the majority's reply chosen."""
    a, b = item["sides"][SCHEMA]
    chosen_b = majority_side(item["labels"][SCHEMA]) == "B"
    prompt = [{"role": "user", "content": item["text"]}]
    return prompt, [{"role": "assistant", "content": b if chosen_b else a}], \
        [{"role": "assistant", "content": a if chosen_b else b}]


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
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    sides.quiet_transformers()
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
    trainer = DPOTrainer(model=sides.load_4bit(args.model, args.threads), ref_model=None, args=config,
                         train_dataset=data, processing_class=tokenizer, peft_config=sides.lora_config(LORA))
    started = time.perf_counter()
    out = trainer.train()
    seconds = time.perf_counter() - started
    return {"pairs_per_s": out.metrics["train_samples_per_second"],
            "pairs_per_s_wall": len(rows) * args.epochs / seconds,  # with a precomputed reference, its pass too
            "agreement": _held_out_agreement(trainer.model.eval(), tokenizer, items),
            "peak_rss_mb": sides.peak_rss_mb()}


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
    items = json.loads((work / "items.json").read_text())
    rows = [dict(zip(("prompt", "completion"), _conversation(it)[:2])) for it in items if not it["holdout"]]
    trainer = sides.trl_sft_trainer(rows, work / "sft-out", args, LORA)
    trainer.train()
    return {"agreement": _held_out_agreement(trainer.model.eval(), trainer.processing_class, items)}


def build_model(directory: Path, items: list, hidden: int, layers: int) -> str:
    from tests.support.tiny_llm import build_tiny_causal_lm

    texts = [it["text"] for it in items] + [side for it in items for side in it["sides"][SCHEMA]]
    return str(build_tiny_causal_lm(directory, texts, "llama", vocab_size=2000, hidden=hidden, layers=layers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=200, help="training pairs")
    parser.add_argument("--holdout", type=int, default=100, help="held-out pairs")
    parser.add_argument("--trl-precompute", action="store_true",
                        help="TRL computes the reference log-probabilities once, before training")
    sides.add_arguments(parser, learning_rate=3e-3, max_length=512, seed=SEED)
    args = parser.parse_args()
    if args.child:
        side, work = args.child[0], Path(args.child[1])
        figures = {"ours": ours_in_this_process, "trl": lambda w: trl_in_this_process(w, args),
                   "sft": lambda w: sft_in_this_process(w, args)}[side](work)
        print(json.dumps(figures))
        return
    import torch

    items = make_items(args.train, args.holdout, longest=MAX_FILLER)
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
            order = ["ours", "trl"] if r % 2 == 0 else ["trl", "ours"]
            for side in order + (["sft"] if r == 0 else []):  # the SFT baseline's agreement, once
                figures = sides.child(__file__, side, work, args, ["--trl-precompute"] if args.trl_precompute else [])
                results[side].append(figures)
                print("round {} {:5}: {}".format(r + 1, side, json.dumps(
                    {k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items() if k != "model_line"})),
                    flush=True)
    ours, trl = results["ours"], results["trl"]
    print("\n" + ours[0]["model_line"])
    print("training: ours {:.1f} pairs/s, TRL DPOTrainer {:.1f} pairs/s (medians); ratio {}".format(
        statistics.median(o["pairs_per_s"] for o in ours), statistics.median(t["pairs_per_s"] for t in trl),
        sides.ratio([o["pairs_per_s"] / t["pairs_per_s"] for o, t in zip(ours, trl)])))
    print("peak RSS: ours {:.0f} MB (training and predicting), TRL {:.0f} MB (training) (max over rounds)".format(
        max(o["peak_rss_mb"] for o in ours), max(t["peak_rss_mb"] for t in trl)))
    print("held-out agreement: ours {} (the base model: {}), TRL {}; SFT on the chosen replies alone {}".format(
        ", ".join(str(o["agreement"]) for o in ours), ours[0]["agreement_before"],
        ", ".join(str(t["agreement"]) for t in trl), results["sft"][0]["agreement"]))
    print("\n{:.0f} s in all".format(time.monotonic() - started))


if __name__ == "__main__":
    main()
