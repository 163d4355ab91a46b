"""ONNX Runtime's session in a process of its own (potato/training/trainers/onnx_session.py): the logits an in-process
session gives, a clear message when the child cannot start or dies, and its memory counted as the worker's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

numpy = pytest.importorskip("numpy")
onnxruntime = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from potato.training.trainers.onnx_session import SessionFailed, SessionProcess  # noqa: E402
from potato.training import helper_processes  # noqa: E402
from potato.training.worker import read_rss_mb  # noqa: E402


def write_model(path) -> str:
    """A graph with a model's inputs and output: logits = (sum of kept ids, minus it), float32, one row per row."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["kept"]),
        helper.make_node("Cast", ["kept"], ["kept_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["kept_f", "axes"], ["total"], keepdims=1),
        helper.make_node("Neg", ["total"], ["minus"]),
        helper.make_node("Concat", ["total", "minus"], ["logits"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"])
         for name in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every onnxruntime of the last years reads
    onnx.save(model, str(path))
    return str(path)


def test_the_session_process_gives_the_logits_of_a_session_here_and_leaves_when_closed(tmp_path):
    path = write_model(tmp_path / "tiny.onnx")
    ids = numpy.array([[3, 4, 5, 0], [7, 1, 0, 0], [2, 2, 2, 2]], dtype=numpy.int64)
    mask = (ids > 0).astype(numpy.int64)
    here = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    expected = here.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
    with SessionProcess(path, 1) as session:
        pid = session.pid
        got = session.logits(ids, mask)
        assert got.dtype == numpy.float32 and got.flags.writeable
        assert got.tolist() == expected.tolist() == [[12.0, -12.0], [8.0, -8.0], [8.0, -8.0]]
        assert session.logits(ids[:1, :2], mask[:1, :2]).tolist() == [[7.0, -7.0]]  # any shape, batch after batch
        # Its memory is the run's: the worker's watchdog counts it with its own.
        assert pid in helper_processes._pids
        assert helper_processes.resident_mb() > 20
        assert read_rss_mb() >= helper_processes.resident_mb()
    assert pid not in helper_processes._pids
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no zombie left behind


def test_a_file_that_is_not_a_model_fails_with_onnx_runtimes_words(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"not a model\n")
    with pytest.raises(SessionFailed) as failed:
        SessionProcess(str(path), 1)
    assert str(failed.value).startswith(("InvalidProtobuf: ", "Fail: ", "RuntimeException: ")), str(failed.value)
    assert str(path) in str(failed.value)
    assert helper_processes._pids == set()


def test_a_session_process_that_dies_says_how_and_the_next_batch_fails_with_it(tmp_path):
    path = write_model(tmp_path / "tiny.onnx")
    ids = numpy.ones((2, 3), dtype=numpy.int64)
    session = SessionProcess(path, 1)
    try:
        os.kill(session.pid, signal.SIGKILL)
        with pytest.raises(SessionFailed, match=r"^the session process was killed by signal 9$"):
            session.logits(ids, ids)
    finally:
        session.close()
    assert helper_processes._pids == set()


def test_the_child_leaves_when_the_worker_goes_without_closing_it(tmp_path):
    """A worker killed outright closes the child's stdin with its death: the child ends on its own."""
    path = write_model(tmp_path / "tiny.onnx")
    script = ("import sys; from potato.training.trainers.onnx_session import SessionProcess; "
              "s = SessionProcess(sys.argv[1], 1); print(s.pid, flush=True); sys.stdin.read()")
    worker = subprocess.Popen([sys.executable, "-c", script, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    child = int(worker.stdout.readline())
    worker.kill()
    worker.wait(timeout=30)
    deadline = time.monotonic() + 30
    while os.path.exists("/proc/{}".format(child)) and _state(child) != "Z":  # a zombie has ended
        assert time.monotonic() < deadline, "the session process outlived its worker"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        with open("/proc/{}/stat".format(pid)) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
