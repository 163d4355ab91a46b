"""Training throughput of hf-reward-model against TRL's ``RewardTrainer``, with held-out agreement beside it.

Both sides train the same model on the same comparisons: customer complaints,
each with two replies of long-tailed length (a word of remedy or of
brush-off among filler words, about 25 for most replies, past 250 for a few,
cut at ``max_length`` tokens), the reply offering a remedy preferred by each of three annotators
unless one's choice is flipped (10 %). The same pairs, split, seed, epochs,
batch size, learning rate, thread count and the same token ids (the prompt
and a reply as a text pair, truncated to ``max_length``). What differs is
only how they train:

- ours: the real worker (``python -m potato.training.worker``) on a bundle,
  ``hf-reward-model`` with ``epochs`` set (so no validation share: every pair
  trains); pairs per second from its events (the ``progress`` event of step
  0 to that of the last step); agreement with the held-out majority from its
  ``scores.json``;
- baseline: TRL's ``RewardTrainer`` with its defaults except what both must
  share — ``gradient_checkpointing`` off and fp32 on a CPU (its defaults, on
  and bf16, only slow it down here; bf16 on a GPU) — given the same token
  ids as ``chosen_ids`` / ``rejected_ids`` (the majority's reply chosen), in
  a subprocess of its own so both sides start alike; its
  ``train_samples_per_second``, and the agreement of its rewards on the same
  held-out pairs.

Full fine-tune and LoRA (r=8). Rounds alternate which side goes first
(bench/_versus_trainer.py); the ratio printed is the median of the rounds'.
Target: >= 1.3 with agreement no lower than the baseline's.
``bash scripts/install.sh --bench`` installs TRL; to leave the virtualenv as
it is, put TRL where the baseline's interpreter finds it instead:

    pip install --target /tmp/trl --no-deps trl datasets pyarrow pandas dill multiprocess aiohttp \\
        aiohappyeyeballs aiosignal frozenlist multidict propcache yarl
    PYTHONPATH=/tmp/trl HF_HUB_OFFLINE=1 .venv/bin/python bench/reward_throughput.py [--train 200] [--holdout 100]

Measured on this project's 2-core CPU machine, 2 threads, load average 3.7-3.8
(``--train 200 --holdout 100 --epochs 2 --rounds 2``, the shipped MiniLM,
max_length 256; reply words: median 25, 90th percentile 73, longest 230):
full fine-tune 12.4 against 7.1 pairs/s, 1.74x (1.69-1.79 over 2 rounds),
held-out agreement 0.98 against 0.98; LoRA 16.7 against 9.7 pairs/s, 1.73x
(1.65-1.82), 0.98 against 0.98. The RewardTrainer pads each random batch of
pairs to its longest reply; ours pads length-grouped batches. (With dropout
on, as it first was, ours agreed on 0.95 against the RewardTrainer's 0.98 in the one round measured:
the reason it is off.)

Run by hand; never part of CI's pass/fail.
"""

from __future__ import annotations

import math
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench import _versus_trainer as vs  # noqa: E402
from potato.training.answer_kinds import majority_side  # noqa: E402
from tests.support.bundles import (  # noqa: E402
    BRUSH_OFFS,
    COMPARISON_ANSWERS,
    COMPARISON_SCHEMAS,
    COMPLAINTS,
    FILLER,
    REMEDIES,
)

SCHEMA = "pref"
MAX_FILLER = 300


def _reply(rng: random.Random, core: str, longest: int = MAX_FILLER) -> str:
    """A reply of long-tailed length: the median about 25 words of filler, one in ten past 70, a few past 250
    (``longest`` at most)."""
    n = min(longest, int(rng.lognormvariate(3.2, 0.8)))
    filler = [rng.choice(FILLER) for _ in range(n)]
    filler.insert(rng.randrange(len(filler) + 1), core)
    return " ".join(filler)


def make_items(n_train: int, n_holdout: int, noise: float = 0.1, longest: int = MAX_FILLER) -> list:
    """Complaints with two replies each, the remedy preferred by each of three annotators unless ``noise``
    flips that one's choice; the last ``n_holdout`` held out (bench/dpo_throughput.py uses them too)."""
    rng = random.Random(vs.SEED)
    items = []
    for i in range(n_train + n_holdout):
        good, bad = _reply(rng, rng.choice(REMEDIES), longest), _reply(rng, rng.choice(BRUSH_OFFS), longest)
        good_side = rng.choice("AB")
        counts = {"A": 0, "B": 0, "tie": 0}
        for _ in range(3):
            counts[good_side if rng.random() >= noise else "AB".replace(good_side, "")] += 1
        items.append({"id": "c{}".format(i), "text": rng.choice(COMPLAINTS),
                      "sides": {SCHEMA: [good, bad] if good_side == "A" else [bad, good]},
                      "labels": {SCHEMA: counts}, "holdout": i >= n_train})
    return items


def learning_rate(lora: bool) -> float:
    return vs.LORA_LR if lora else vs.FULL_LR


def run_ours(work: Path, items: list, args, lora: bool) -> dict:
    done = vs.run_worker(work, items, args.threads,
                         {"trainer": "hf-reward-model", "schemas": [SCHEMA],
                          "options": vs.options(args, lora, learning_rate(lora))},
                         {"schemas": COMPARISON_SCHEMAS, "answers": COMPARISON_ANSWERS})
    n_train = sum(1 for it in items if not it["holdout"])
    return {"ex_per_s": n_train * args.epochs / done["seconds"], "agreement": done["scores"][SCHEMA]["agreement"]}


def run_baseline(work: Path, items: list, args, lora: bool) -> dict:
    return vs.run_child(__file__, work, items, args, lora, [])


def _pair_ids(tokenizer, item: dict, max_length: int) -> tuple:
    """The item's (A, B) token ids as ours makes them: the prompt and a reply as a text pair."""
    prompt, sides = item["text"], item["sides"][SCHEMA]
    enc = tokenizer([prompt, prompt], sides, truncation="longest_first", max_length=max_length)
    return enc["input_ids"][0], enc["input_ids"][1]


def baseline_in_this_process(items: list, args) -> dict:
    import pyarrow
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    torch, cuda = vs.baseline_setup(args)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    rows = []
    for item in (it for it in items if not it["holdout"]):
        a, b = _pair_ids(tokenizer, item, args.max_length)
        chosen_b = majority_side(item["labels"][SCHEMA]) == "B"
        rows.append({"chosen_ids": b if chosen_b else a, "rejected_ids": a if chosen_b else b})
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=1, dtype=torch.float32,
                                                               ignore_mismatched_sizes=True)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if args.lora:
        model = vs.lora_model(model, "SEQ_CLS")
    config = RewardConfig(
        output_dir=str(Path(args.baseline_child) / "out"), num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size, learning_rate=learning_rate(args.lora), seed=args.seed,
        save_strategy="no", report_to=[], logging_strategy="no", disable_tqdm=True, use_cpu=not cuda, bf16=cuda,
        gradient_checkpointing=False, max_length=None)  # the ids are cut at max_length already, as ours are
    # A fingerprint of our own: datasets' own (a dill pickle of the table) fails on this pyarrow.
    train = Dataset(pyarrow.Table.from_pylist(rows), fingerprint="reward-throughput")
    trainer = RewardTrainer(model=model, args=config, train_dataset=train, processing_class=tokenizer)
    out = trainer.train()
    model = trainer.model.eval()
    agreed = decided = 0
    with torch.no_grad():
        for item in (it for it in items if it["holdout"]):
            side = majority_side(item["labels"][SCHEMA])
            if side == "tie":
                continue
            a, b = _pair_ids(tokenizer, item, args.max_length)
            batch = tokenizer.pad({"input_ids": [a, b]}, return_tensors="pt").to(model.device)
            rewards = model(**batch).logits[:, 0].float().tolist()
            decided += 1
            agreed += ("B" if rewards[1] >= rewards[0] else "A") == side
    return {"ex_per_s": out.metrics["train_samples_per_second"], "agreement": round(agreed / decided, 4)}


def main() -> None:
    args = vs.parse(__doc__, 100, baseline_in_this_process)
    if args is None:
        return
    items = make_items(args.train, args.holdout)
    lengths = sorted(len(side.split()) for it in items for side in it["sides"][SCHEMA])
    print("{} training / {} held-out pairs (reply words: median {}, 90th percentile {}, longest {}), {} epochs, "
          "batch {}, max_length {}, {}, model {}".format(
              args.train, args.holdout, lengths[len(lengths) // 2], lengths[math.floor(0.9 * len(lengths))],
              lengths[-1], args.epochs, args.batch_size, args.max_length, vs.where(args), args.model), flush=True)
    vs.run_rounds(items, args, run_ours, run_baseline, "agreement", "agreement", unit="pairs/s")


if __name__ == "__main__":
    main()
