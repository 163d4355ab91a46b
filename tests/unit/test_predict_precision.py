"""Fast paths checked against fp32 (potato/training/trainers/predict_precision.py): the sample, the decision,
the run log's words, the int8 twins of a model's linear layers, and the ONNX export's child."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from potato.training.trainers import predict_precision as pp
from potato.training.trainers.predict_precision import FastPathCheck, check_sample, checked_predictions, tie_gap


class Probs(list):
    """What ``forward`` returns in the trainer: a CPU tensor of probabilities, here only its ``tolist``."""

    def tolist(self):
        return [list(row) for row in self]


def test_the_sample_spreads_over_long_and_short_texts_and_needs_enough_items():
    order = list(range(1000, 0, -1))  # longest first
    sample, rest = check_sample(order, want=10)
    assert len(sample) == 10 and sorted(sample + rest) == sorted(order)
    assert sample[0] == 1000 and sample[-1] <= 100  # the longest and among the shortest
    assert check_sample(list(range(20)), want=10) == ([], list(range(20)))  # twice the sample: int8 cannot pay


def test_tie_gap_is_how_far_the_two_likeliest_labels_are_apart():
    assert tie_gap([0.2, 0.7, 0.1]) == pytest.approx(0.5)
    assert tie_gap([1.0]) == 1.0


def test_int8_is_kept_when_it_moves_little_and_ties_go_back_to_fp32():
    check = FastPathCheck()
    for k in range(99):
        p = (0.9, 0.52, 0.505)[k % 3]
        check.add([p, 1 - p], [p - 0.004, 1 - p + 0.004])  # int8 moves each probability by 0.004
    assert check.decide(1.0, 0.5) and check.use_fast
    assert check.redo_gap == pytest.approx(0.012)  # 1.5 x twice the largest change
    # The items at 0.505 (0.002 apart in int8) go back to fp32; the others keep int8's change.
    assert check.mean_change == pytest.approx(66 * 0.004 / 99)
    check.fast_items, check.redone = 900, 40
    assert check.describe() == (
        "predicted 860 items in int8 and 139 in fp32: 99 both ways to check int8, which, with the items close to a "
        "tie predicted in fp32, moved confidences by 0.0027 on average; 40 more close to a tie (their two likeliest "
        "labels within 0.012 in int8)")


def test_int8_is_refused_when_it_moves_confidences_too_far():
    check = FastPathCheck()
    for _ in range(50):
        check.add([0.99, 0.01], [0.96, 0.04])
    assert not check.decide(1.0, 0.5)
    assert check.describe() == ("predicted in fp32: on 50 items predicted both ways int8 moved confidences by "
                                "0.0300 on average (give or take 0.0000), too close to 0.01")
    check = FastPathCheck()
    for k in range(50):  # 0.008 on average, but so unevenly that the sample cannot tell it from 0.01
        check.add([0.99, 0.01], [0.95, 0.05] if k % 5 == 0 else [0.99, 0.01])
    assert not check.decide(1.0, 0.5) and check.reason == ("on 50 items predicted both ways int8 moved confidences "
                                                          "by 0.0080 on average (give or take 0.0023), too close to 0.01")


def test_int8_is_refused_when_the_items_it_predicts_twice_would_eat_its_gain():
    check = FastPathCheck()
    for k in range(50):
        check.add([0.51, 0.49], [0.5, 0.5]) if k % 5 == 0 else check.add([0.9, 0.1], [0.9, 0.1])
    assert check.decide(1.0, 0.5)  # a fifth predicted twice: 1 / (0.5 + 0.2) = 1.43x
    assert not check.decide(1.0, 0.7)  # 1 / (0.7 + 0.2) = 1.11x
    assert check.describe() == ("predicted in fp32: on 50 items predicted both ways int8 took 70% of fp32's time "
                                "and 20% of them were close enough to a tie to need fp32 again, so it would be only "
                                "1.11x as fast")
    empty = FastPathCheck()
    assert not empty.decide(0.0, 0.0)
    assert empty.describe() == "predicted in fp32: too few items for int8 to pay for its check"


def test_checked_predictions_write_fp32_for_the_sample_and_for_ties_int8_for_the_rest():
    fp32 = {"a": [0.9, 0.1], "b": [0.8, 0.2], "c": [0.51, 0.49], "d": [0.7, 0.3]}
    int8 = {"a": [0.899, 0.101], "b": [0.79, 0.21], "c": [0.501, 0.499], "d": [0.69, 0.31]}
    calls, batches_done = [], []

    def forward(rows, use_fast):
        calls.append((list(rows), use_fast))
        return Probs((int8 if use_fast else fp32)[row] for row in rows)

    check = FastPathCheck()
    out = dict(checked_predictions(forward, [["a"]], [["b", "c", "d"]], check, lambda: batches_done.append(1)))
    assert out == {"a": fp32["a"], "b": int8["b"], "c": fp32["c"], "d": int8["d"]}  # c was near a tie
    assert calls == [(["a"], False), (["a"], True), (["b", "c", "d"], True), (["c"], False)]
    assert (check.fast_items, check.redone, len(batches_done)) == (3, 1, 2)


def test_the_fast_path_is_set_up_after_the_samples_fp32_pass_and_torn_down_when_refused():
    fp32 = {"a": [0.9, 0.1], "b": [0.8, 0.2]}
    far = {"a": [0.6, 0.4], "b": [0.5, 0.5]}  # moves confidences far past MAX_MEAN_CHANGE
    steps = []

    def forward(rows, use_fast):
        steps.append(("fast" if use_fast else "fp32", list(rows)))
        return Probs((far if use_fast else fp32)[row] for row in rows)

    check = FastPathCheck("onnx")
    out = list(checked_predictions(forward, [["a"]], [["b"]], check, lambda: None,
                                   set_up=lambda: steps.append("set up"), tear_down=lambda: steps.append("torn down")))
    assert out == [("a", fp32["a"]), ("b", fp32["b"])]
    assert steps == [("fp32", ["a"]), "set up", ("fast", ["a"]), "torn down", ("fp32", ["b"])]
    assert check.describe().startswith("predicted in fp32: on 1 items predicted both ways ONNX Runtime ")
    # A fast path that cannot be set up is never run: the schema predicts in fp32 and the log says why.
    steps.clear()
    check = FastPathCheck("onnx")
    out = list(checked_predictions(forward, [["a"]], [["b"]], check, lambda: None,
                                   set_up=lambda: "ONNX Runtime could not be set up here: no"))
    assert out == [("a", fp32["a"]), ("b", fp32["b"])] and steps == [("fp32", ["a"]), ("fp32", ["b"])]
    assert check.describe() == "predicted in fp32: ONNX Runtime could not be set up here: no"


def test_a_cpu_capped_below_bf16_counts_as_without(monkeypatch):
    class Cpu:
        @staticmethod
        def _is_avx512_bf16_supported():
            return True

    class Torch:
        cpu = Cpu

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert pp.cpu_has_bf16(Torch)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert not pp.cpu_has_bf16(Torch)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert pp.cpu_has_bf16(Torch)


def test_int8_twins_compute_in_int8_only_when_on_and_leave_the_model_as_it_was():
    torch = pytest.importorskip("torch")
    if pp.int8_unavailable(torch):
        pytest.skip(pp.int8_unavailable(torch))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    x = torch.randn(8, 5, 64)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.inference_mode():
        before = model(x)
        with pp.Int8Linears(torch, model) as linears:
            assert linears._layers == [model[0]]  # the 2-output head stays in fp32
            assert torch.equal(model(x), before)
            with linears.on():
                int8 = model(x)
            assert torch.equal(model(x), before)
        assert "forward" not in vars(model[0])
        assert torch.equal(model(x), before)
    # 0.1, not tighter: on a CPU without VNNI, fbgemm keeps activations to 7 bits
    # (so its 16-bit sums cannot saturate), which about doubles the error (0.06 seen).
    assert not torch.equal(int8, before) and torch.allclose(int8, before, atol=0.1)
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


class OneThreadTorch:
    """What the export's child asks of torch before it exports: one thread."""

    @staticmethod
    def set_num_threads(n):
        assert n == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the export forks on Linux only")
def test_an_export_that_dies_hangs_or_fails_in_its_child_says_how_and_leaves_nothing_running(tmp_path, monkeypatch):
    written = tmp_path / "model.onnx"

    def export(torch, model, path, exporter):
        if exporter == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        if exporter == "stuck":
            time.sleep(60)
        if exporter == "fails":
            raise ValueError("Unsupported: ONNX export of operator 'aten::weird'\nand a trace")
        with open(path, "w") as f:
            f.write("a graph")

    monkeypatch.setattr(pp, "_export", export)
    children = []
    fork = os.fork

    def recorded_fork():
        pid = fork()
        if pid:
            children.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", recorded_fork)
    pp._export_apart(OneThreadTorch, object(), str(written), "works")
    assert written.read_text() == "a graph"  # the child's file, in the parent's directory
    with pytest.raises(pp.ExportFailed) as failed:
        pp._export_apart(OneThreadTorch, object(), str(written), "fails")
    assert str(failed.value) == "ValueError: Unsupported: ONNX export of operator 'aten::weird'"
    with pytest.raises(pp.ExportFailed) as failed:
        pp._export_apart(OneThreadTorch, object(), str(written), "killed")
    assert str(failed.value) == "the export process was killed by signal 9"
    monkeypatch.setattr(pp, "EXPORT_SECONDS", 0.5)
    started = time.monotonic()
    with pytest.raises(pp.ExportFailed) as failed:
        pp._export_apart(OneThreadTorch, object(), str(written), "stuck")
    assert str(failed.value) == "the export was still running after 0.5 s and was stopped"
    assert time.monotonic() - started < 30
    assert len(children) == 4
    for pid in children:  # each waited for: none left running, nor unreaped
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024.0 for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="weights are paged out on Linux only")
def test_paging_out_gives_the_weights_memory_back_and_the_model_predicts_as_before(tmp_path):
    """While ONNX Runtime predicts in its own process the worker's copy of the weights goes to page cache: the
    process's memory falls by their size, even with the parameters still listed elsewhere (as an optimizer
    lists them), and the model computes and saves the same numbers from the file, which is gone already."""
    import ctypes

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 2048))  # 48 MB
    listed = list(model.parameters())
    x = torch.randn(3, 1024)
    with torch.no_grad():
        before_out = model(x)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc_trim(0)
    rss = _rss_mb()
    with torch.inference_mode():  # as the trainer's predict calls it
        assert pp.page_out(torch, model, str(tmp_path))
    libc.malloc_trim(0)
    assert rss - _rss_mb() > 40
    assert list(tmp_path.iterdir()) == []
    assert [p is q for p, q in zip(listed, model.parameters())] == [True] * 4
    with torch.no_grad():
        assert torch.equal(model(x), before_out)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
