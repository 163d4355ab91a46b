"""The real worker (``python -m potato.training.worker``) on tiny bundles with a tiny random BERT.

Each test runs the worker as a subprocess, offline (HF_HUB_OFFLINE=1), and
checks what it leaves in the job directory against docs/architecture.md
("The job directory").
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from potato.training.events import read_events  # noqa: E402
from tests.support.bundles import easy_items, write_job  # noqa: E402
from tests.support.tiny_model import tiny_model_path  # noqa: E402

pytestmark = pytest.mark.training

ROOT = Path(__file__).resolve().parents[2]
TINY = {"epochs": 10, "learning_rate": 3e-3, "batch_size": 16, "max_length": 32}


def worker_env(extra_path: Path | None = None) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    paths = ([str(extra_path)] if extra_path else []) + [str(ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def start_worker(job_dir: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "potato.training.worker", str(job_dir)],
        env=env or worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: lets the test look for leftover children
    )


def run_worker(job_dir: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = start_worker(job_dir, env)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())


def events_of(job_dir: Path) -> list[dict]:
    return read_events(str(job_dir / "events.jsonl"))[0]


def done_of(job_dir: Path) -> dict:
    events = events_of(job_dir)
    assert events and events[-1]["type"] == "done", events
    return events[-1]


def processes_in_group(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path("/proc", entry, "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(entry))
    return pids


def stop_mid_training(job_dir: Path) -> None:
    """Start the worker on *job_dir*, send SIGTERM (what every backend's stop sends) once it has made a training
    step, and check it ends as a stop must: exit 143, run ``cancelled``, no predictions, no process left."""
    proc = start_worker(job_dir)
    try:
        deadline = time.monotonic() + 90
        while not any(e["type"] == "progress" and e.get("step", 0) > 0 for e in events_of(job_dir)):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no training step within 90 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    assert processes_in_group(proc.pid) == []
    assert done_of(job_dir)["status"] == "cancelled"
    assert not (job_dir / "predictions.jsonl").exists()


@pytest.fixture(scope="module")
def tiny_model() -> str:
    return str(tiny_model_path())


def test_full_fine_tune_learns_and_writes_the_job_directory(tmp_path, tiny_model):
    items = easy_items(120, unlabeled=10)
    job = write_job(tmp_path / "job", items=items, options=dict(TINY, model=tiny_model), include_unlabeled=True)
    result = run_worker(job)
    assert result.returncode == 0, result.stderr
    assert (job / "exit_code").read_text().strip() == "0"

    events = events_of(job)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0] == {**events[0], "type": "log", "message": "Loading trainer 'hf-text-classification' and its packages"}
    started = events[1]
    assert started["type"] == "started"
    assert started["device"] == "cpu" and started["device_name"].startswith("CPU (")
    assert isinstance(started["pid"], int) and started["python"].count(".") == 2
    assert events[-1] == {"seq": len(events), "t": events[-1]["t"], "type": "done", "status": "succeeded"}
    train = [e for e in events if e["type"] == "progress" and e["phase"] == "train"]
    assert train and train[-1]["step"] == train[-1]["total"] == 60 and train[-1]["epoch"] == 10
    assert train[0]["step"] == 0 and "loss" not in train[0]  # training begins
    assert len(train) >= 2 and all(isinstance(e["loss"], float) for e in train[1:])
    assert any(e["type"] == "progress" and e["phase"] == "predict" for e in events)
    assert not [e for e in events if e["type"] == "log" and e["level"] != "info"]

    scores = json.loads((job / "scores.json").read_text())
    assert scores["sentiment"]["n"] == 24
    assert scores["sentiment"]["accuracy"] >= 0.8, scores
    assert scores["sentiment"]["macro_f1"] >= 0.8, scores
    metrics = [e for e in events if e["type"] == "metrics"]
    assert metrics and metrics[-1]["scores"] == scores

    predictions = [json.loads(line) for line in (job / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 130  # every labelled item and, with include_unlabeled, the 10 others
    assert {p["id"] for p in predictions} == {it["id"] for it in items}
    assert all(p["schema"] == "sentiment" and p["label"] in ("positive", "negative") for p in predictions)
    assert all(0.5 <= p["confidence"] <= 1.0 for p in predictions)
    # Every record carries the whole softmax, in label order (holdout calibration, the review order read it).
    for p in predictions:
        assert len(p["probs"]) == 2 and abs(sum(p["probs"]) - 1) < 1e-4
        best = max(p["probs"])
        assert p["confidence"] == best and p["label"] == ["positive", "negative"][p["probs"].index(best)]

    saved = job / "artifacts" / "sentiment"
    assert json.loads((saved / "labels.json").read_text())["labels"] == ["positive", "negative"]
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(saved)
    tokenizer = AutoTokenizer.from_pretrained(saved)
    assert model.config.id2label == {0: "positive", 1: "negative"}
    import torch

    with torch.inference_mode():
        logits = model(**tokenizer(["great wonderful product", "awful terrible box"], padding=True,
                                   return_tensors="pt")).logits
    assert logits.argmax(-1).tolist() == [0, 1]


def test_ids_utf8_cannot_encode_or_two_megabytes_long_reach_predictions_and_events_escaped(tmp_path, tiny_model):
    # The server never sends such ids (it refuses or ignores them), but a worker meeting one must not crash.
    odd = ["\ud83d", "nul\x00id", "x" * 2_000_000]
    items = easy_items(20, unlabeled=0)
    items += [{"id": item_id, "text": "great wonderful", "labels": {}, "holdout": False} for item_id in odd]
    job = write_job(tmp_path / "job", items=items, options=dict(TINY, model=tiny_model, epochs=1),
                    include_unlabeled=True)
    result = run_worker(job)
    assert result.returncode == 0, result.stderr
    lines = (job / "predictions.jsonl").read_bytes().splitlines()
    assert {json.loads(line)["id"] for line in lines} == {it["id"] for it in items}
    assert b"\\ud83d" in b"".join(lines)  # JSON's own escape for it: the file stays valid UTF-8
    assert done_of(job)["status"] == "succeeded"


@pytest.mark.filterwarnings("ignore::FutureWarning")  # peft calls a deprecated transformers API
def test_lora_without_unlabeled_items_on_a_missing_gpu(tmp_path, tiny_model, monkeypatch):
    job = write_job(
        tmp_path / "job", items=easy_items(60, unlabeled=5),
        options=dict(TINY, model=tiny_model, epochs=3, lora={"r": 4, "alpha": 8}),
        include_unlabeled=False, device="cuda:1",
    )
    result = run_worker(job)
    assert result.returncode == 0, result.stderr
    events = events_of(job)
    assert events[1]["type"] == "started" and events[1]["device"] == "cpu"
    warnings = [e["message"] for e in events if e["type"] == "log" and e["level"] == "warning"]
    assert len(warnings) == 1 and "'cuda:1'" in warnings[0] and "training on CPU (" in warnings[0]

    predictions = [json.loads(line) for line in (job / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 60 and not [p for p in predictions if p["id"].startswith("u")]

    saved = job / "artifacts" / "sentiment"
    adapter = json.loads((saved / "adapter_config.json").read_text())
    assert os.path.isabs(adapter["base_model_name_or_path"])
    assert os.path.samefile(adapter["base_model_name_or_path"], tiny_model)
    assert not (saved / "model.safetensors").exists()  # only the adapter is saved
    from peft import AutoPeftModelForSequenceClassification

    monkeypatch.chdir(tmp_path)  # the absolute base path loads from anywhere
    model = AutoPeftModelForSequenceClassification.from_pretrained(saved)
    assert model.peft_config["default"].r == 4


def test_sigterm_stops_training_cancelled_143_no_children(tmp_path, tiny_model):
    job = write_job(tmp_path / "job", items=easy_items(120, unlabeled=0),
                    options=dict(TINY, model=tiny_model, epochs=2000))
    proc = start_worker(job)
    try:
        deadline = time.monotonic() + 60
        while not any(e["type"] == "progress" for e in events_of(job)):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no progress event within 60 s"
            time.sleep(0.1)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143
        assert time.monotonic() - sent < 5
    finally:
        if proc.poll() is None:
            proc.kill()
    assert processes_in_group(proc.pid) == []
    done = done_of(job)
    assert done["status"] == "cancelled"
    assert (job / "exit_code").read_text().strip() == "143"
    assert not (job / "predictions.jsonl").exists()


def test_over_max_ram_mb_exits_4_with_the_fix(tmp_path, tiny_model):
    job = write_job(tmp_path / "job", items=easy_items(20), options=dict(TINY, model=tiny_model), max_ram_mb=60)
    result = run_worker(job, timeout=60)
    assert result.returncode == 4, result.stderr
    done = done_of(job)
    assert done["status"] == "failed"
    assert done["error"].startswith("The worker used ")
    assert done["error"].endswith(
        "MB of memory, over model_training.max_ram_mb (60); "
        "raise max_ram_mb or train with a smaller batch_size or max_length"
    )
    assert (job / "exit_code").read_text().strip() == "4"


def test_a_missing_trainer_module_exits_3_with_the_spec_text(tmp_path):
    """peft is only looked up at start (the trainer imports it for lora alone): not there, the run ends at once."""
    hide = tmp_path / "hide"
    hide.mkdir()
    # As where peft is not installed: the interpreter's import system finds no such module.
    (hide / "sitecustomize.py").write_text(
        "import sys\n"
        "class NoPeft:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'peft':\n"
        "            raise ModuleNotFoundError(\"No module named 'peft'\", name='peft')\n"
        "sys.meta_path.insert(0, NoPeft())\n")
    job = write_job(tmp_path / "job", items=easy_items(20))
    result = run_worker(job, env=worker_env(extra_path=hide), timeout=60)
    assert result.returncode == 3, result.stderr
    done = done_of(job)
    assert done == {**done, "status": "failed",
                    "error": "Trainer 'hf-text-classification' could not be imported (missing module: peft)"}
    assert [e["type"] for e in events_of(job)] == ["log", "log", "done"]  # loading…, the import error, done
    assert (job / "exit_code").read_text().strip() == "3"


def test_peft_is_imported_only_for_lora(tmp_path, tiny_model):
    """A peft that breaks on import does not stop a full fine-tune, which never imports it (180 MB and seconds
    saved); a LoRA run stops on it with what to do."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "peft.py").write_text('raise ImportError("cannot import name \'x\' from \'transformers\'")\n')
    options = dict(TINY, model=tiny_model, epochs=1)
    full = write_job(tmp_path / "full", items=easy_items(20), options=options)
    result = run_worker(full, env=worker_env(extra_path=hide))
    assert result.returncode == 0, result.stderr
    assert done_of(full)["status"] == "succeeded"
    lora = write_job(tmp_path / "lora", items=easy_items(20), options=dict(options, lora={"r": 4}))
    result = run_worker(lora, env=worker_env(extra_path=hide))
    assert result.returncode == 1, result.stderr
    assert done_of(lora) == {**done_of(lora), "status": "failed", "error": (
        "lora needs the peft package, which could not be imported here (ImportError: cannot import name 'x' from "
        "'transformers'): pip install peft, or take lora out of the options")}


def test_a_hub_id_that_is_not_here_fails_fast_offline(tmp_path):
    job = write_job(tmp_path / "job", items=easy_items(20), options={"model": "nobody-here/no-such-model"})
    started = time.monotonic()
    result = run_worker(job, timeout=60)
    assert time.monotonic() - started < 10
    assert result.returncode == 1, result.stderr
    error = done_of(job)["error"]
    assert "'nobody-here/no-such-model' is not on this machine" in error
    assert "download it on a machine with network access" in error
    assert "set model to that directory" in error


def test_a_max_length_past_the_models_is_lowered_with_a_warning(tmp_path, tiny_model):
    job = write_job(tmp_path / "job", items=easy_items(20, unlabeled=0),
                    options=dict(TINY, model=tiny_model, epochs=1, max_length=512))
    result = run_worker(job, timeout=60)
    assert result.returncode == 0, result.stderr
    warnings = [e["message"] for e in events_of(job) if e["type"] == "log" and e["level"] == "warning"]
    assert warnings == ["max_length 512 is more than the model takes; using its 128"]
    assert json.loads((job / "artifacts/sentiment/labels.json").read_text())["max_length"] == 128


def test_decision_calibrate_runs_without_torch(tmp_path):
    """It only rescales stored probabilities: the worker must choose no device (that imports torch),
    set no torch threads and start no data-parallel processes for it, whatever the job asks."""
    job = write_job(tmp_path / "job", items=easy_items(4, unlabeled=0), trainer="decision-calibrate",
                    num_threads=1, processes=2)
    source = job / "bundle" / "calibrate"
    source.mkdir()
    (source / "source.json").write_text(json.dumps({"run_id": 7, "schemas": {"sentiment": ["positive", "negative"]}}))
    rows = [{"id": f"h{i}", "schema": "sentiment", "holdout": True, "gold": "positive",
             "label": "positive" if i % 4 else "negative", "confidence": 0.99} for i in range(40)]
    (source / "labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (source / "predictions.jsonl").write_text("".join(
        json.dumps({"id": r["id"], "schema": "sentiment", "label": r["label"], "confidence": 0.99}) + "\n"
        for r in rows))
    blocked = tmp_path / "no_torch"
    (blocked / "torch").mkdir(parents=True)
    (blocked / "torch" / "__init__.py").write_text("raise ImportError('torch is blocked by this test')\n")

    result = run_worker(job, env=worker_env(blocked), timeout=60)

    assert result.returncode == 0, result.stderr
    events = events_of(job)
    started = [e for e in events if e["type"] == "started"]
    assert [(e["device"], e["device_name"]) for e in started] == [("cpu", "CPU (no device needed)")]
    assert done_of(job)["status"] == "succeeded"
    assert "torch is blocked" not in result.stderr
    assert len((job / "predictions.jsonl").read_text().splitlines()) == 40


def test_bad_options_fail_with_the_key(tmp_path, tiny_model):
    job = write_job(tmp_path / "job", items=easy_items(20), options={"model": tiny_model, "epochs": -1})
    result = run_worker(job, timeout=60)
    assert result.returncode == 1
    assert done_of(job)["error"] == "Trainer options: epochs must be a positive integer, got -1"


def test_the_same_seed_gives_the_same_predictions(tmp_path, tiny_model, monkeypatch):
    """In-process (the trainer's ``train(job, events)`` as the worker calls it), twice."""
    from potato.training.events import EventWriter
    from potato.training.trainers import hf_text_classification as hf
    from potato.training.worker import read_job

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    items = easy_items(40, unlabeled=4)
    outputs = []
    for name in ("a", "b"):
        job = read_job(str(write_job(tmp_path / name, items=items, options=dict(TINY, model=tiny_model, epochs=2))))
        hf.train(job, EventWriter(str(tmp_path / name / "events.jsonl")))
        outputs.append((tmp_path / name / "predictions.jsonl").read_text())
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 44


def test_predict_precision_auto_uses_the_cpus_bf16_and_changes_no_label(tmp_path, tiny_model, monkeypatch):
    """auto predicts in bf16 where this CPU computes it (fp32 where not); fp32 asks for fp32; the log says which."""
    import torch

    from potato.training.events import EventWriter
    from potato.training.trainers import hf_common
    from potato.training.trainers import hf_text_classification as hf
    from potato.training.worker import read_job

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    items = easy_items(60, unlabeled=20)
    runs = {}
    for precision in ("auto", "fp32"):
        path = write_job(tmp_path / precision, items=items,
                         options=dict(TINY, model=tiny_model, predict_precision=precision), include_unlabeled=True)
        hf.train(read_job(str(path)), EventWriter(str(path / "events.jsonl")))
        model_line = next(e["message"] for e in events_of(path) if e["type"] == "log" and e["message"].startswith("Model "))
        predictions = [json.loads(line) for line in (path / "predictions.jsonl").read_text().splitlines()]
        runs[precision] = (model_line, {p["id"]: p for p in predictions})
    bf16 = hf_common.cpu_has_bf16(torch)
    assert runs["auto"][0].endswith(", trains in full precision (fp32), predicts in " + (
        "bf16 autocast (the CPU has bf16 instructions)" if bf16 else "fp32"))
    assert runs["fp32"][0].endswith(", trains in full precision (fp32), predicts in fp32")
    auto, fp32 = runs["auto"][1], runs["fp32"][1]
    assert auto.keys() == fp32.keys() and len(auto) == 80
    assert max(abs(auto[i]["confidence"] - fp32[i]["confidence"]) for i in auto) < (0.01 if bf16 else 1e-9)
    # So only an item fp32 puts within 0.01 of the two labels' tie may change label.
    assert all(auto[i]["label"] == fp32[i]["label"] for i in auto if fp32[i]["confidence"] >= 0.51)


# What holds torch's kernels to AVX2 with no bf16, as on most laptops and small VMs (bench/predict_throughput.py).
AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}


def test_predict_precision_auto_on_a_cpu_without_bf16_checks_onnx_runtime_against_fp32(tmp_path, tiny_model):
    """The real worker with its kernels held to AVX2 and onnxruntime installed: auto exports the model to ONNX,
    checks ONNX Runtime against fp32 on a sample and predicts in whichever the check allows; its labels are
    fp32's on all but at most 0.5 % of the items, the log names the path and why, and the export is gone."""
    from potato.training.trainers.predict_precision import CHECK_ITEMS

    sample = CHECK_ITEMS["onnx"]
    items = easy_items(60, unlabeled=3 * CHECK_ITEMS["int8"])  # more than twice the sample: the fast path can pay
    runs = {}
    for precision in ("auto", "fp32"):
        job = write_job(tmp_path / precision, items=items, include_unlabeled=True,
                        options=dict(TINY, model=tiny_model, predict_precision=precision))
        result = run_worker(job, dict(worker_env(), **AVX2_ONLY))
        assert result.returncode == 0, result.stderr
        logs = [e["message"] for e in events_of(job) if e["type"] == "log"]
        predictions = [json.loads(line) for line in (job / "predictions.jsonl").read_text().splitlines()]
        runs[precision] = (logs, {p["id"]: p for p in predictions})
        # The export lives in the job's directory while prediction runs, never among the artifacts.
        assert not [p.name for p in job.rglob("*") if p.name.startswith("onnx-") or ".onnx" in p.name]
    logs = runs["auto"][0]
    assert next(m for m in logs if m.startswith("Model ")).endswith(
        ", predicts in ONNX Runtime where it agrees with fp32, checked per schema (the CPU has no bf16 instructions)")
    assert next(m for m in runs["fp32"][0] if m.startswith("Model ")).endswith(", predicts in fp32")
    assert len([m for m in logs if re.fullmatch(
        r"Schema 'sentiment': exported to ONNX by torch's torchscript exporter in \d+\.\d s", m)]) == 1, logs
    # The schema's line says which path ran: ONNX Runtime computes in fp32 too, so no item comes near a tie it
    # could flip; or fp32, where on the sample it was not 1.2x as fast (the tiny model's batches take torch so
    # little time that a busy machine can make it so).
    predicted = [m for m in logs if m.startswith("Schema 'sentiment': predicted ")]
    kept = predicted == [
        "Schema 'sentiment': predicted {} items in ONNX Runtime and {} in fp32: {} both ways to check ONNX Runtime, "
        "which, with the items close to a tie predicted in fp32, moved confidences by 0.0000 on average; 0 more close "
        "to a tie (their two likeliest labels within 0.000 in ONNX Runtime)".format(
            len(items) - sample, sample, sample)]
    assert kept or (len(predicted) == 1 and re.fullmatch(
        r"Schema 'sentiment': predicted in fp32: on {} items predicted both ways ONNX Runtime took \d+% of fp32's "
        r"time and 0% of them were close enough to a tie to need fp32 again, so it would be only \d+\.\d\dx as "
        r"fast".format(sample), predicted[0])), logs
    assert not [m for m in runs["fp32"][0] if m.startswith("Schema 'sentiment': predicted ")]
    auto, fp32 = runs["auto"][1], runs["fp32"][1]
    assert auto.keys() == fp32.keys() and len(auto) == len(items)
    assert sum(auto[i]["label"] != fp32[i]["label"] for i in auto) <= 0.005 * len(auto)
    assert sum(abs(auto[i]["confidence"] - fp32[i]["confidence"]) for i in auto) / len(auto) < 0.01


def test_onnx_asked_predicts_every_item_through_onnx_runtime_and_leaves_a_lora_as_it_was(tiny_model, tmp_path,
                                                                                         monkeypatch):
    """predict_precision: onnx exports the model into the work directory (a LoRA merged into the base weights for
    the export, unmerged after), predicts every item through ONNX Runtime as torch does in fp32, and deletes the
    export; where it cannot be set up, or onnxruntime is missing, the items come out in fp32 and the log says why."""
    import sys

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from potato.training import helper_processes
    from potato.training.trainers import hf_text_classification as hf
    from potato.training.trainers import predict_precision as precision
    from potato.training.trainers.answers import SchemaAnswers
    from potato.training.trainers.hf_common import ComputeDevice
    from potato.training.trainers.hf_heads import make_head

    logs = []

    class Events:
        def check_cancelled(self):
            pass

        def progress(self, *args, **kwargs):
            pass

        def log(self, message, level="info"):
            logs.append(message)

    model = get_peft_model(AutoModelForSequenceClassification.from_pretrained(tiny_model),
                           LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, init_lora_weights=False))
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = [[(k, ("i{}".format(k), "this was really great and perfect " * (k % 4)))] for k in range(6)]
    head = make_head(SchemaAnswers("s", ["positive", "negative"]))
    fp32 = list(hf.predict(model, tokenizer, iter(rows), 6, 32, ComputeDevice(torch, "cpu", "fp32"), Events(), "s",
                           head))
    asked = ComputeDevice(torch, "cpu", "onnx", fast=("onnx", "int8"))
    assert asked.predict_precision == "ONNX Runtime (the model exported to ONNX, as predict_precision asks)"
    predicted = hf.predict(model, tokenizer, iter(rows), 6, 32, asked, Events(), "s", head, work_dir=str(tmp_path))
    first = next(predicted)
    assert [p.name for p in tmp_path.glob("onnx-*/*.onnx")] == ["torchscript.onnx"]  # there while it predicts
    onnx = [first] + list(predicted)
    assert list(tmp_path.iterdir()) == []  # and gone after
    assert _close(onnx, fp32)
    assert all(torch.allclose(weights[k], v, atol=1e-6) for k, v in model.state_dict().items())
    assert len(logs) == 1 and re.fullmatch(
        r"Schema 's': exported to ONNX by torch's torchscript exporter in \d+\.\d s", logs[0]), logs
    assert helper_processes._pids == set()  # ONNX Runtime's process ended with prediction

    # ONNX Runtime's process killed (for memory, say) while it predicts: the model here predicts the rest.
    logs.clear()
    predicted = hf.predict(model, tokenizer, iter(rows), 6, 32, asked, Events(), "s", head, work_dir=str(tmp_path))
    first = next(predicted)
    (session,) = helper_processes._pids
    os.kill(session, signal.SIGKILL)
    assert _close([first] + list(predicted), fp32)
    assert logs[1:] == ["Schema 's': ONNX Runtime stopped (the session process was killed by signal 9); the other "
                        "items predict in fp32"], logs
    assert list(tmp_path.iterdir()) == [] and helper_processes._pids == set()

    # A torch without the TorchScript exporter (torch calls it deprecated): the dynamo one exports.
    real_export = precision._export

    def no_torchscript(torch, model, path, exporter):
        if exporter == "torchscript":
            raise TypeError("export() got an unexpected keyword argument 'dynamic_axes'")
        real_export(torch, model, path, exporter)

    monkeypatch.setattr(precision, "_export", no_torchscript)
    logs.clear()
    assert _close(list(hf.predict(model, tokenizer, iter(rows), 6, 32, asked, Events(), "s", head)), fp32)
    assert re.fullmatch(r"Schema 's': exported to ONNX by torch's dynamo exporter in \d+\.\d s", logs[0]), logs
    # A graph that gives other logits than the model on a batch of another shape is never taken; nor is any, here.
    monkeypatch.setattr(precision, "EXPORT_TOLERANCE", -1.0)
    logs.clear()
    assert list(hf.predict(model, tokenizer, iter(rows), 6, 32, asked, Events(), "s", head)) == fp32
    assert len(logs) == 1 and re.fullmatch(
        r"Schema 's': predicts in fp32: ONNX Runtime could not be set up here: torchscript exporter: TypeError: "
        r"export\(\) got an unexpected keyword argument 'dynamic_axes'; dynamo exporter: its graph's "
        r"logits are \S+ from the model's on a batch of another shape", logs[0]), logs
    assert all(torch.allclose(weights[k], v, atol=1e-6) for k, v in model.state_dict().items())

    def broken(*args):
        raise RuntimeError("the exporter failed\nits long trace")

    monkeypatch.setattr(hf, "OnnxModel", broken)
    logs.clear()
    assert list(hf.predict(model, tokenizer, iter(rows), 6, 32, asked, Events(), "s", head)) == fp32
    assert logs == ["Schema 's': predicts in fp32: ONNX Runtime could not be set up here: the exporter failed"]
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as where it is not installed
    assert ComputeDevice(torch, "cpu", "onnx", fast=("onnx", "int8")).predict_precision == (
        "fp32 (onnxruntime not installed here: pip install onnxruntime)")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert ComputeDevice(torch, "cpu", "auto", fast=("onnx", "int8")).predict_precision == (
        "int8 where it agrees with fp32, checked per schema (the CPU has no bf16 instructions; ONNX Runtime would be "
        "faster: onnxruntime not installed here: pip install onnxruntime)")


def _close(predicted, fp32):
    """The same items, in the same order, with outputs as fp32's but for rounding."""
    return [r[0] for r in predicted] == [r[0] for r in fp32] and max(
        abs(a - b) for (_, p), (_, q) in zip(predicted, fp32) for a, b in zip(p, q)) < 1e-4


def test_int8_that_cannot_be_set_up_predicts_in_fp32_and_says_why(tiny_model, monkeypatch):
    """A torch whose int8 kernels fail (a later release may drop them): every item still comes out, in fp32."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from potato.training.trainers import hf_text_classification as hf
    from potato.training.trainers.answers import SchemaAnswers
    from potato.training.trainers.hf_common import ComputeDevice
    from potato.training.trainers.hf_heads import make_head
    from potato.training.trainers.predict_precision import FastPathCheck

    class Events:
        def check_cancelled(self):
            pass

        def progress(self, *args, **kwargs):
            pass

    def broken(torch, model):
        raise RuntimeError("quantized::linear_prepack is gone")

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = [[(k, ("i{}".format(k), "this was really great and perfect " * (k % 3)))] for k in range(6)]
    head = make_head(SchemaAnswers("s", ["positive", "negative"]))
    fp32 = list(hf.predict(model, tokenizer, iter(rows), 6, 32, ComputeDevice(torch, "cpu", "fp32", fast=("int8",)),
                           Events(), "s", head))
    asked = ComputeDevice(torch, "cpu", "int8", fast=("int8",))  # int8 as asked: every item, the model left as it was
    assert (asked.predict_fast, asked.predict_checked) == ("int8", False)
    int8 = list(hf.predict(model, tokenizer, iter(rows), 6, 32, asked, Events(), "s", head))
    assert [r[0] for r in int8] == [r[0] for r in fp32] and [r[1] for r in int8] != [r[1] for r in fp32]
    assert list(hf.predict(model, tokenizer, iter(rows), 6, 32, ComputeDevice(torch, "cpu", "fp32", fast=("int8",)),
                           Events(), "s", head)) == fp32
    assert ComputeDevice(torch, "cpu", "auto").predict_fast is None  # a trainer with no fast path
    # int8's check is a softmax's: another head predicts in fp32 even where int8 is asked for, and says so.
    logs = []
    Events.log = lambda self, message, level="info": logs.append(message)
    multilabel = make_head(SchemaAnswers("m", ["positive", "negative"], {"kind": "multilabel"}))
    assert list(hf.predict(model, tokenizer, iter(rows), 6, 32, asked, Events(), "m", multilabel)) == list(
        hf.predict(model, tokenizer, iter(rows), 6, 32, ComputeDevice(torch, "cpu", "fp32"), Events(), "m", multilabel))
    assert logs == ["Schema 'm': predicts in fp32: int8 is for nominal schemas only"]
    dev = ComputeDevice(torch, "cpu", "auto", fast=("int8",))
    assert (dev.predict_fast, dev.predict_checked) == ("int8", True)
    monkeypatch.setattr(hf, "Int8Linears", broken)
    check = FastPathCheck()
    predicted = list(hf.predict(model, tokenizer, iter(rows[2:]), 6, 32, dev, Events(), "s", head, iter(rows[:2]),
                                check))
    assert predicted == fp32
    assert check.describe() == "predicted in fp32: int8 could not be set up here: quantized::linear_prepack is gone"
