"""What the LLM benches (bench/llm_throughput.py, bench/dpo_throughput.py) share.

Each side runs in a fresh interpreter of its own (the bench script with
``--child SIDE WORKDIR``), so both start alike; ours is the real worker on a
job directory, the baselines load the same model in 4-bit NF4 with the same
LoRA. Rounds alternate which side goes first; the ratio printed is the
median of the rounds' ratios, with their range.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from bench._versus_trainer import thread_env

ROOT = Path(__file__).resolve().parents[1]


def add_arguments(parser: argparse.ArgumentParser, *, learning_rate: float, max_length: int, seed: int) -> None:
    """The arguments every side shares (``child`` passes them on), the tiny Llama's size and ``--child``."""
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=learning_rate)
    parser.add_argument("--max-length", type=int, default=max_length)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--model", default=None, help="causal LM directory (default: a tiny Llama built here)")
    parser.add_argument("--hidden", type=int, default=64, help="the tiny Llama's hidden size (the tests': 64)")
    parser.add_argument("--layers", type=int, default=2, help="the tiny Llama's layers (the tests': 2)")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "WORKDIR"), help=argparse.SUPPRESS)


def child(script: str, side: str, work: Path, args: Any, extra: Sequence[str] = ()) -> dict:
    """Run one side of ``script`` in a fresh interpreter with the shared arguments; returns its figures."""
    argv = [sys.executable, script, "--child", side, str(work), "--model", args.model, "--threads",
            str(args.threads), "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
            "--learning-rate", str(args.learning_rate), "--max-length", str(args.max_length), "--seed", str(args.seed),
            *extra]
    result = subprocess.run(argv, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), **thread_env(args.threads)))
    if result.returncode != 0:
        raise SystemExit("{} failed:\n{}".format(side, result.stderr[-3000:]))
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_worker(job: Path) -> Tuple[List[Dict[str, Any]], str]:
    """Run the real worker on ``job`` (what an earlier round left removed); its events and its ``Model:`` line."""
    from potato.training.events import read_events
    from potato.training.worker import run

    for stale in ("events.jsonl", "exit_code", "predictions.jsonl", "scores.json", "artifacts"):
        shutil.rmtree(job / stale, ignore_errors=True) if stale == "artifacts" else (job / stale).unlink(missing_ok=True)
    code = run(str(job))
    if code != 0:
        raise SystemExit("the worker exited with {}: {}".format(code, (job / "events.jsonl").read_text()[-2000:]))
    events = read_events(str(job / "events.jsonl"))[0]
    model_line = next(e["message"] for e in events if e["type"] == "log" and e["message"].startswith("Model: "))
    return events, model_line


def load_4bit(model_dir: str, threads: int):
    """The causal LM with its linear layers in 4-bit NF4 (double quantisation), as ours loads it."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    torch.set_num_threads(threads)
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map={"": 0 if cuda else "cpu"},
                                                quantization_config=BitsAndBytesConfig(
                                                    load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                    bnb_4bit_compute_dtype=dtype, bnb_4bit_use_double_quant=True))


def lora_config(lora: Dict[str, Any]):
    from peft import LoraConfig

    return LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                      target_modules=lora["target_modules"], task_type="CAUSAL_LM")


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def trl_sft_trainer(rows: List[Dict[str, Any]], out_dir: Path, args: Any, lora: Dict[str, Any]):
    """TRL's ``SFTTrainer`` on prompt-completion ``rows`` (the loss on the completion only), the 4-bit base
    and ``lora``, the shared schedule (linear decay, no warm-up) and ``gradient_checkpointing`` off as ours."""
    import pyarrow
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    quiet_transformers()
    cuda = torch.cuda.is_available()
    # A fingerprint of our own: datasets' own (a dill pickle of the table) fails on this pyarrow.
    data = Dataset(pyarrow.Table.from_pylist(rows), fingerprint=out_dir.name)
    config = SFTConfig(
        output_dir=str(out_dir), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, lr_scheduler_type="linear", warmup_steps=0, seed=args.seed,
        max_length=args.max_length, completion_only_loss=True, gradient_checkpointing=False,
        save_strategy="no", report_to=[], logging_strategy="no", disable_tqdm=True, use_cpu=not cuda, bf16=cuda,
    )
    return SFTTrainer(model=load_4bit(args.model, args.threads), args=config, train_dataset=data,
                      processing_class=AutoTokenizer.from_pretrained(args.model), peft_config=lora_config(lora))


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024.0 / (1024.0 if sys.platform == "darwin" else 1.0)


def ratio(values: list) -> str:
    return "{:.2f}x (range {:.2f}-{:.2f} over {} rounds)".format(
        statistics.median(values), min(values), max(values), len(values))
