"""events.jsonl writing and reading, device choice's pure parts, the trainer's pure functions."""

from __future__ import annotations

import json
import threading

import pytest

from potato.training.device import has_kernels
from potato.training.atomic_files import write_text
from potato.training.events import Cancelled, EventWriter, read_events
from potato.training.worker import import_error_message, memory_message
from potato.training.trainers import hf_common
from potato.training.trainers import hf_text_classification as hf


# -- events ------------------------------------------------------------------


def test_events_are_numbered_timed_and_done_is_last(tmp_path):
    path = tmp_path / "events.jsonl"
    w = EventWriter(str(path))
    w.emit("started", pid=1, device="cpu", device_name="CPU (2 threads)")
    w.log("hello", level="warning")
    w.progress("train", 1, 4, epoch=0.25, loss=0.5)
    w.metrics({"s": {"accuracy": 1.0, "macro_f1": 1.0, "n": 2}})
    w.done("succeeded")
    w.log("after done")  # dropped: done stays last
    events, offset = read_events(str(path))
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5]
    assert [e["type"] for e in events] == ["started", "log", "progress", "metrics", "done"]
    assert events[1] == {"seq": 2, "t": events[1]["t"], "type": "log", "level": "warning", "message": "hello"}
    assert events[2]["phase"] == "train" and events[2]["loss"] == 0.5 and events[2]["epoch"] == 0.25
    assert events[-1]["status"] == "succeeded" and "error" not in events[-1]
    assert all(isinstance(e["t"], float) for e in events)
    assert offset == path.stat().st_size


def test_a_nan_loss_is_written_as_null_with_one_warning(tmp_path):
    """A diverging training's loss: JSON has no NaN, the server refuses one."""
    path = tmp_path / "events.jsonl"
    w = EventWriter(str(path), progress_interval=0)
    w.progress("train", 1, 4, epoch=0.25, loss=float("nan"))
    w.progress("train", 2, 4, epoch=0.5, loss=float("inf"))
    w.metrics({"s": {"accuracy": 0.5, "macro_f1": float("nan"), "n": 2}})
    w.done("failed", "The loss diverged")
    def refuse(constant):
        raise AssertionError(f"{constant} in events.jsonl")

    events = [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]
    assert [e["type"] for e in events] == ["log", "progress", "progress", "log", "metrics", "done"]
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5, 6]
    assert events[0] == {"seq": 1, "t": events[0]["t"], "type": "log", "level": "warning", "message":
                         "progress.loss was nan; written as null, since JSON has no NaN or Infinity. A loss that is "
                         "not a number means the training diverged: try a lower learning_rate. Later such values "
                         "of progress.loss are written as null without another warning"}
    assert events[1]["loss"] is None and events[2]["loss"] is None  # the second one without a new warning
    assert events[3]["message"].startswith("metrics.scores.s.macro_f1 was nan; written as null")
    assert events[4]["scores"] == {"s": {"accuracy": 0.5, "macro_f1": None, "n": 2}}


def test_reader_ignores_a_partial_last_line_and_resumes_from_the_offset(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"seq":1,"type":"log"}\n{"seq":2,"ty')
    events, offset = read_events(str(path))
    assert [e["seq"] for e in events] == [1]
    assert offset == len('{"seq":1,"type":"log"}\n')
    with path.open("a") as f:
        f.write('pe":"log"}\n')
    events, offset2 = read_events(str(path), offset)
    assert [e["seq"] for e in events] == [2]
    assert read_events(str(path), offset2) == ([], offset2)


def test_reader_of_a_missing_file_and_of_garbage(tmp_path):
    assert read_events(str(tmp_path / "nope.jsonl"), 7) == ([], 7)
    path = tmp_path / "events.jsonl"
    path.write_text('not json\n\n{"seq": 3, "type": "done"}\n')
    assert [e["seq"] for e in read_events(str(path))[0]] == [3]


def test_progress_is_throttled_but_the_last_step_is_written(tmp_path):
    w = EventWriter(str(tmp_path / "e.jsonl"), progress_interval=3600)
    for step in range(1, 101):
        w.progress("train", step, 100, loss=1.0)
    steps = [e["step"] for e in read_events(str(tmp_path / "e.jsonl"))[0]]
    assert steps == [1, 100]


def test_writer_is_thread_safe(tmp_path):
    w = EventWriter(str(tmp_path / "e.jsonl"))
    threads = [threading.Thread(target=lambda: [w.log("x") for _ in range(200)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events, _ = read_events(str(tmp_path / "e.jsonl"))
    assert [e["seq"] for e in events] == list(range(1, 801))


def test_a_new_writer_continues_the_numbering(tmp_path):
    path = str(tmp_path / "e.jsonl")
    EventWriter(path).log("one")
    EventWriter(path).log("two")
    assert [e["seq"] for e in read_events(path)[0]] == [1, 2]


def test_cancel_request_raises_at_the_next_check(tmp_path):
    w = EventWriter(str(tmp_path / "e.jsonl"))
    w.check_cancelled()
    w.request_cancel()
    assert w.cancelled
    with pytest.raises(Cancelled):
        w.check_cancelled()


def test_write_atomic_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "scores.json"
    write_text(str(target), json.dumps({"a": 1}))
    write_text(str(target), json.dumps({"a": 2}))
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["scores.json"]


# -- messages ------------------------------------------------------------------


def test_memory_message_names_the_key_and_a_fix():
    assert memory_message(2100.4, 2000) == (
        "The worker used 2100 MB of memory, over model_training.max_ram_mb (2000); "
        "raise max_ram_mb or train with a smaller batch_size or max_length"
    )


def test_import_error_message_starts_with_the_spec_text():
    exc = ModuleNotFoundError("No module named 'peft'", name="peft")
    text = import_error_message("hf-text-classification", exc, "peft")
    assert text.startswith("Trainer 'hf-text-classification' could not be imported")  # the user guide's words
    assert text == "Trainer 'hf-text-classification' could not be imported (missing module: peft)"
    assert import_error_message("t", ImportError("boom"), "torch.cuda").endswith("(missing module: torch)")


# -- device ------------------------------------------------------------------


@pytest.mark.parametrize("capability, arch_list, expected", [
    ((8, 0), ["sm_80", "sm_90"], True),
    ((8, 6), ["sm_80"], True),             # same major, higher minor: binary compatible
    ((7, 5), ["sm_80", "sm_90"], False),   # too old for this build
    ((7, 0), ["sm_80", "compute_80"], False),
    ((12, 0), ["sm_90", "compute_90"], True),  # PTX JIT-compiles upwards
    ((12, 0), ["sm_80", "sm_90"], False),  # new GPU, old wheel without PTX
    ((9, 0), ["sm_90a"], True),
    ((10, 0), ["sm_100"], True),
    ((8, 0), [], True),                    # the build does not say: let torch decide
])
def test_has_kernels(capability, arch_list, expected):
    assert has_kernels(capability, arch_list) is expected


# -- the trainer's pure parts ------------------------------------------------------


def test_check_options_accepts_the_defaults_and_lora():
    assert hf.check_options({}) == []
    assert hf.check_options(None) == []
    assert hf.check_options(dict(hf.DEFAULT_OPTIONS)) == []
    assert hf.check_options({"lora": {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["query"]}}) == []
    assert hf.check_options({"lora": True, "learning_rate": 1e-4, "model": "bert-base-uncased"}) == []


def test_check_options_names_each_bad_key():
    problems = hf.check_options({
        "epochs": -1, "batch_size": 0, "max_length": "long", "learning_rate": 0, "seed": 1.5,
        "lora": {"r": 0, "alpha": -1, "dropout": 1.0, "rank": 4}, "epoch": 3,
    })
    assert "epochs must be a positive integer, got -1" in problems
    assert "batch_size must be a positive integer, got 0" in problems
    assert "max_length must be a positive integer, got 'long'" in problems
    assert "learning_rate must be a positive number, got 0" in problems
    assert "seed must be an integer, got 1.5" in problems
    assert "lora.r must be a positive integer, got 0" in problems
    assert "lora.alpha must be a positive number, got -1" in problems
    assert "lora.dropout must be a number from 0 to below 1, got 1.0" in problems
    assert any(p.startswith("lora.rank is not a LoRA option") for p in problems)
    assert any(p.startswith("'epoch' is not an option of hf-text-classification") for p in problems)
    assert hf.check_options({"epochs": True}) == ["epochs must be a positive integer, got True"]
    assert hf.check_options({"lora": "yes"})[0].startswith("lora must be false or a mapping")
    assert hf.check_options({"predict_precision": "bf16"}) == [
        "predict_precision must be auto, fp32, int8 or onnx, got 'bf16'"]
    assert [hf.check_options({"predict_precision": p}) for p in ("fp32", "int8", "onnx")] == [[], [], []]


def test_effective_options_fill_defaults():
    full = hf.effective_options({})
    assert full["lora"] is None and full["learning_rate"] == hf_common.FULL_LEARNING_RATE
    lora = hf.effective_options({"lora": {"r": 4}})
    assert lora["lora"] == {"r": 4, "alpha": 16, "dropout": 0.1, "target_modules": None}
    assert lora["learning_rate"] == hf_common.LORA_LEARNING_RATE
    assert hf.effective_options({"lora": True, "learning_rate": 0.01})["learning_rate"] == 0.01


def test_a_missing_model_directory_fails_with_the_path(tmp_path):
    missing = str(tmp_path / "no-model")
    with pytest.raises(Exception, match="is not a directory on this machine"):
        hf_common.resolve_model(missing)
