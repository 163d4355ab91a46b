"""How a Hugging Face trainer predicts on a CPU without bf16 instructions: ONNX Runtime or int8, checked
against fp32.

A CPU with AVX512-BF16 or AMX predicts in bf16 autocast (hf_common.ComputeDevice).
Most CPUs of the small VMs and laptops that run an annotation server have
neither — AVX2 at best — and there torch's fp32 prediction reaches about 1.5x
``transformers.pipeline`` at best. Two fast paths, the first that runs on the
machine taken (``FAST_PATHS``):

- ONNX Runtime (:class:`OnnxModel`): the model exported to ONNX and run by
  ONNX Runtime's CPU kernels, still in fp32, so it changes outputs only by
  rounding (0.00001 at most on bench/predict_throughput.py's MiniLM) and
  keeps every label; it needs ``onnxruntime``, ``onnx`` and ``onnxscript``
  (the ``train-text`` extra).
- int8 (:class:`Int8Linears`), where those are not installed.

int8: fp32 prediction is bound by the linear layers' matrix products (80 % of
a MiniLM's time). With int8 twins of those
layers (weights quantized per output channel, activations per batch,
fbgemm's kernels) the model predicted 1.75x as many items per CPU second,
but int8 moves a model's outputs more than bf16 does, by how much depends on
the model, and it moved this one's a lot: on AVX2 kernels (MiniLM trained on
400 reviews, 300 predicted), int8 changed 1.7 % of the labels and
confidences by 0.013 on average, where bf16 changed none and 0.0005.
(Activations quantized per token, through ``torch._int_mm``, changed 0.7 %
and 0.008 and ran at only 1.2x fp32's speed; 7-bit activations, torch's
default for these kernels, changed 2.3 % and 0.019.)

So ``predict_precision: auto`` trusts no fast path blindly (:class:`FastPathCheck`,
written for int8, holds ONNX Runtime to the same rules). It predicts a
sample of each schema's items (``CHECK_ITEMS``: 256 for int8, 64 for ONNX
Runtime, spread over short and long texts) both ways and writes fp32's predictions for them; from the sample it
takes the largest change int8 made to any probability and, for the other
items, predicts in int8 and predicts again in fp32 every item whose two
likeliest labels int8 puts closer than ``SAFETY`` times twice that change —
the only items whose label int8 could have flipped. Where an item is close
to a tie, its confidence is also where int8 moves it most, so the items that
stay in int8 are the ones it changes least. int8 is kept only when, on the
sample, those rules leave confidences within ``MAX_MEAN_CHANGE`` of fp32's on
average, with two standard errors to spare, and would still predict
``MIN_SPEEDUP`` times as fast as fp32 once the items close to a tie are
predicted twice (timed on the sample);
otherwise the schema predicts in fp32, and the run log says why either way.
``predict_precision: int8`` asks for int8 on every item, unchecked, and
``onnx`` for ONNX Runtime.

What that buys depends on how sure the model is. bench/predict_throughput.py's
MiniLM, trained on 400 short reviews, is unsure of many long ones: its check
(3 000 reviews, AVX2 kernels) found int8 taking 67 % of fp32's time but 23 %
of the items close enough to a tie to need fp32 again, 1.12x in all, so it
predicts in fp32 — not the 2x over ``transformers.pipeline`` that int8 alone
reaches (2.09x per CPU second, at 1.4 % of labels changed). A model sure of
most items keeps int8 for them.

To measure this path on a CPU that has bf16, set ``ONEDNN_MAX_CPU_ISA=AVX2``
(oneDNN then uses no bf16 instruction, and :func:`cpu_has_bf16` agrees);
``bench/predict_throughput.py --isa avx2`` also sets the variables that hold
torch's other kernels (ATen, MKL, fbgemm) to AVX2, for both sides of the bench.

Part of the remote half: importing this module loads only the standard
library (and potato.training.probe); torch is passed in, and onnxruntime
is imported only in the session's own process (potato/training/trainers/onnx_session.py).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
import warnings
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

from potato.training.trainers.onnx_session import SessionProcess
from potato.training.probe import first_line

PREDICT_PRECISIONS = ("auto", "fp32", "int8", "onnx")

# Items of each schema predicted both ways before a fast path is trusted with the others. int8's sample measures
# how far int8 moves outputs; ONNX Runtime computes in fp32 as torch does, so its sample only has to show the
# export right on the project's own texts (bench/predict_throughput.py --isa avx2, 3 000 reviews, the
# pipeline's speed times 2.04 with 256, 2.08 with 64).
CHECK_ITEMS = {"int8": 256, "onnx": 64}
SAFETY = 1.5  # how much more than the sample's largest change a tie must be apart to stay in int8
MAX_MEAN_CHANGE = 0.01  # the bound on confidences' change, on average, that int8 must hold
# int8 is kept only if, by the sample's timings and its share of items to predict again in fp32, it
# would predict at least this much faster than fp32: on a model with many items near a tie, the items
# predicted twice eat the gain (MiniLM trained on 400 reviews, 1 000 predicted on AVX2 kernels, per CPU
# second: fp32 54.7, int8 93.9, int8 checked with 27 % predicted again 48.9).
MIN_SPEEDUP = 1.2
# A layer with fewer outputs than this stays in fp32: a classification head, whose few products cost
# nothing and whose outputs are the logits themselves.
MIN_INT8_OUTPUTS = 16

# oneDNN's names for instruction sets without bf16 arithmetic (ONEDNN_MAX_CPU_ISA caps it at one of these).
_ISAS_WITHOUT_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                                "AVX512_CORE_VNNI"})


# -- what the CPU computes -------------------------------------------------------


def cpu_has_bf16(torch: Any) -> bool:
    """Whether this CPU computes bf16 in hardware (AVX512-BF16 or AMX), as torch's oneDNN kernels see it.

    ``ONEDNN_MAX_CPU_ISA`` (or its old name ``DNNL_MAX_CPU_ISA``) set to an
    instruction set without bf16 keeps oneDNN off them, so this answers no.
    The hardware checks are private to torch (``torch.cpu``, 2.3 and later);
    an older torch, or a CPU it cannot tell about (ARM), counts as without.
    """
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        if os.environ.get(name, "").strip().upper() in _ISAS_WITHOUT_BF16:
            return False
    cpu = getattr(torch, "cpu", None)
    for check in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        try:
            if getattr(cpu, check)():
                return True
        except (AttributeError, RuntimeError, TypeError):
            continue
    return False


def int8_unavailable(torch: Any) -> Optional[str]:
    """Why this torch cannot predict in int8 here (None: it can)."""
    engines = getattr(getattr(torch.backends, "quantized", None), "supported_engines", [])
    if not any(engine in engines for engine in ("x86", "fbgemm")):
        return "torch {} has no int8 kernels for this CPU".format(torch.__version__)
    if not (hasattr(torch, "quantize_per_channel") and hasattr(torch.ops.quantized, "linear_dynamic")):
        return "torch {} has no dynamic int8 linear layers".format(torch.__version__)
    return None


# -- the int8 twins of a model's linear layers -------------------------------------


class Int8Linears:
    """int8 twins of ``model``'s linear layers, switched on with :meth:`on`.

    Each ``torch.nn.Linear`` (with at least ``MIN_INT8_OUTPUTS`` outputs)
    gets a forward of its own that computes in int8 while :attr:`active` is
    set and in fp32 otherwise; its fp32 weights stay as they are, so the
    model predicts both ways, saves as before, and the twins add a quarter
    of the linear weights' size. :meth:`remove` (or leaving the ``with``
    block) takes them away. Raises ``RuntimeError`` where the kernels are
    missing (see :func:`int8_unavailable`).
    """

    def __init__(self, torch: Any, model: Any):
        self.torch = torch
        self.active = False
        self._layers = []  # type: List[Any]
        reason = int8_unavailable(torch)
        if reason:
            raise RuntimeError(reason)
        with warnings.catch_warnings():
            # torch marks its quantized tensors deprecated in favour of torchao; the kernels are the
            # ones it has, and a torch without them fails here, which predict() turns into fp32.
            warnings.simplefilter("ignore")
            for layer in model.modules():
                if (isinstance(layer, torch.nn.Linear) and layer.out_features >= MIN_INT8_OUTPUTS
                        and layer.weight.dtype == torch.float32 and layer.weight.device.type == "cpu"):
                    layer.forward = self._twin(layer, _pack(torch, layer))
                    self._layers.append(layer)

    def _twin(self, layer: Any, packed: Any) -> Callable[[Any], Any]:
        fp32 = type(layer).forward
        linear_dynamic = self.torch.ops.quantized.linear_dynamic

        def forward(x: Any, *args: Any, **kwargs: Any) -> Any:  # peft's LoRA layers pass their arguments on
            if self.active:
                # 8-bit activations (reduce_range False): torch's default 7 bits moved confidences 1.5x as far.
                return linear_dynamic(x.contiguous(), packed, False)
            return fp32(layer, x, *args, **kwargs)

        return forward

    def on(self) -> "_Switch":
        """A ``with`` block in which the model computes its linear layers in int8."""
        return _Switch(self)

    def remove(self) -> None:
        for layer in self._layers:
            del layer.forward  # the class's forward again
        self._layers = []

    def __enter__(self) -> "Int8Linears":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


class _Switch:
    def __init__(self, linears: Int8Linears):
        self.linears = linears

    def __enter__(self) -> None:
        self.linears.active = True

    def __exit__(self, *exc: Any) -> None:
        self.linears.active = False


def _pack(torch: Any, layer: Any) -> Any:
    """fbgemm's packed int8 weights of ``layer``: symmetric, one scale per output channel."""
    weight = layer.weight.detach()
    scales = (weight.abs().amax(dim=1).clamp(min=1e-12) / 127).double()
    zeros = torch.zeros(weight.shape[0], dtype=torch.long)
    qweight = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
    bias = layer.bias.detach() if layer.bias is not None else None
    return torch.ops.quantized.linear_prepack(qweight, bias)


# -- the model exported to ONNX, run by ONNX Runtime -------------------------------

ONNX_PACKAGES = ("onnxruntime", "onnx", "onnxscript")  # the session, and torch's exporter


# The fast paths a CPU without bf16 may predict on, the first that runs here first: ONNX Runtime is
# faster than int8 and computes in fp32. Their names in the run log, and what each does.
FAST_PATHS = ("onnx", "int8")
FAST_PATH_NAMES = {"onnx": "ONNX Runtime", "int8": "int8"}
FAST_PATH_HOW = {"onnx": "the model exported to ONNX", "int8": "its linear layers quantized"}


def fast_path_unavailable(torch: Any, path: str) -> Optional[str]:
    """Why this machine cannot predict on the fast ``path`` (None: it can)."""
    return onnx_unavailable() if path == "onnx" else int8_unavailable(torch)


def onnx_unavailable() -> Optional[str]:
    """Why this machine cannot predict through ONNX Runtime (None: it can): a package missing here."""
    import importlib.util

    missing = [name for name in ONNX_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        return "{} not installed here: pip install {}".format(", ".join(missing), " ".join(missing))
    return None


# torch's exporters, tried in this order: the TorchScript one exported bench/predict_throughput.py's MiniLM
# in 1.6 s, and ONNX Runtime ran its graph at 144 items/s; the dynamo one took 7.4 s, and its graph ran at
# 102 items/s (same 1 000 reviews, 2 threads). torch calls the first deprecated; the second is its future.
ONNX_EXPORTERS = ("torchscript", "dynamo")
# How far ONNX Runtime's logits may be from torch's on a batch of another shape than the one traced before an
# export is taken: rounding moves them by 1e-6 or less; a shape baked into the graph, by far more.
EXPORT_TOLERANCE = 1e-3
EXPORT_SECONDS = 600  # a MiniLM exports in 2 s, a large encoder in a minute: past this, a stuck export
CHECK_LOGITS = ".check-logits.pt"  # beside an export: the model's logits on the check's batch (_same_as_torch)


class OnnxModel:
    """``model`` exported to ONNX in a directory of its own under ``work_dir`` and run by ONNX Runtime on
    the CPU, in ``threads`` threads, in a process of its own (:class:`SessionProcess`: the prediction pass
    then carries none of what training left in the worker); :meth:`close` (or leaving the ``with`` block)
    stops that process and deletes the export.

    The export is torch's own (``torch.onnx.export``, the exporters of
    ``ONNX_EXPORTERS`` in turn), with the batch and the sequence dimensions
    free, so one session takes every batch; an export is taken only if ONNX
    Runtime gives torch's logits, within ``EXPORT_TOLERANCE``, on a batch of
    another shape than the one it was traced on. Each export runs in a child
    process of its own where it can (:func:`_export_apart`). A peft model is
    exported with its LoRA merged into the base weights (a plain matrix
    product per layer) in that child, so the model here stays as it was and
    saves so. ONNX Runtime computes in
    fp32 as torch does, with its own fused kernels: on
    bench/predict_throughput.py's MiniLM (1 000 reviews, 2 threads, a quiet
    machine with AVX-512 but no bf16 in use) it predicted 144 items a second
    where torch in fp32 predicted 83, logits 1e-7 apart at most.
    :attr:`exporter` names the exporter taken, :attr:`seconds` what the export
    and the session took. Raises ``RuntimeError`` naming each exporter's
    failure where none is taken (the caller predicts in fp32 then).
    """

    def __init__(self, torch: Any, model: Any, work_dir: str, threads: int):
        import shutil
        import tempfile

        started = time.perf_counter()
        self._dir = tempfile.mkdtemp(prefix="onnx-", dir=work_dir)
        self._rmtree = shutil.rmtree
        self._session = None  # type: Any
        self.exporter = None  # type: Optional[str]
        failures = []
        try:
            for exporter in ONNX_EXPORTERS:
                path = os.path.join(self._dir, exporter + ".onnx")
                try:
                    _export_apart(torch, model, path, exporter)
                    session = SessionProcess(path, threads)
                    try:
                        _same_as_torch(torch, path, session)
                    except BaseException:
                        session.close()
                        raise
                except Exception as exc:  # the next exporter may do
                    failures.append("{} exporter: {}".format(
                        exporter, str(exc) if isinstance(exc, ExportFailed) else first_line(exc)))
                    continue
                self._session, self.exporter = session, exporter
                break
        except BaseException:
            self.close()
            raise
        if self._session is None:
            self.close()
            raise RuntimeError("; ".join(failures))
        self.seconds = time.perf_counter() - started

    def logits(self, input_ids: Any, attention_mask: Any) -> Any:
        """The model's logits (a numpy array) for CPU tensors of token ids and their mask."""
        return self._session.logits(input_ids.numpy(), attention_mask.numpy())

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        self._rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "OnnxModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def page_out(torch: Any, model: Any, work_dir: Optional[str]) -> bool:
    """Move ``model``'s weights out of the process's memory into a file mapped in their place; whether it did.

    Once the sample's fp32 pass is done, and ONNX Runtime is to predict in its
    own process (potato/training/trainers/onnx_session.py), the model here is needed
    only by the export (in its child), for the few items predicted again in
    fp32 and for saving: its weights go to a file under ``work_dir`` that is
    mapped back (``torch.load(mmap=True)``) and unlinked at once, so they are
    page cache the system can take back, not the worker's own memory (86 MB
    for a MiniLM, in 0.2 s), and vanish with the model. Linux only, where a
    mapped file can be unlinked; a model that cannot be moved stays as it was.
    """
    import tempfile

    from potato.training.atomic_files import scratch_file

    if not sys.platform.startswith("linux"):
        return False
    handle, path = scratch_file(work_dir or tempfile.gettempdir(), prefix="weights-", suffix=".pt")
    os.close(handle)
    try:
        # Outside inference mode: tensors made in it could not become the model's parameters.
        with torch.inference_mode(False), torch.no_grad():
            tensors = model.state_dict(keep_vars=True)
            torch.save({name: tensor.detach() for name, tensor in tensors.items()}, path)
            mapped = torch.load(path, mmap=True, weights_only=True)
            # Each parameter keeps its identity (an optimizer's list may still hold it) and takes the mapped data.
            for name, tensor in tensors.items():
                tensor.data = mapped[name]
    except Exception:  # an older torch (mmap came in 2.1), a full disk: the weights stay where they were
        return False
    finally:
        os.unlink(path)
    return True


class ExportFailed(RuntimeError):
    """An export that did not give a graph to take; its message is the user's sentence as it is."""


def _export_apart(torch: Any, model: Any, path: str, exporter: str) -> None:
    """:func:`_export` in a child forked for it, where there is fork (Linux), else here.

    What the exporter loads and builds stays resident after it (in the worker,
    for a MiniLM, 29 MB after the TorchScript exporter and 270 MB after the
    dynamo one: garbage collection and malloc_trim return none of it), and the
    LoRA it merges would have to be unmerged: in the child, both go when it
    exits. The child computes in one thread: the OpenMP threads that trained
    the model are not in it, and torch's one-thread path starts none. A child
    still running after ``EXPORT_SECONDS`` is killed, and the export counts
    as failed.
    """
    if not sys.platform.startswith("linux"):
        _export_merged(torch, model, path, exporter)
        return
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12 warns of a fork in a process with threads: the child uses none of them (nor their locks).
        warnings.simplefilter("ignore")
        pid = os.fork()
    if pid == 0:  # the child: export, say why not on the pipe, and leave without running the parent's exit code
        status = 1
        try:
            os.close(read_end)
            # The worker's SIGTERM handler only marks the run cancelled, for the parent to notice: the
            # child stops at once instead, as at a Ctrl-C.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            torch.set_num_threads(1)
            _export_merged(torch, model, path, exporter, unmerge=False)
            status = 0
        except BaseException as exc:
            os.write(write_end, first_line(exc).encode("utf-8", "replace")[:2000])
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        try:
            status = _wait(pid, time.monotonic() + EXPORT_SECONDS)
        except BaseException:
            _kill(pid)
            raise
        why = pipe.read().decode("utf-8", "replace")
    if status is None:
        raise ExportFailed("the export was still running after {} s and was stopped".format(EXPORT_SECONDS))
    if status < 0:
        raise ExportFailed("the export process was killed by signal {}".format(-status))
    if status != 0:
        raise ExportFailed(why or "the export process ended with status {}".format(status))


def _wait(pid: int, deadline: float) -> Optional[int]:
    """The child's exit status, or None (the child killed) once ``deadline`` passes."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:  # as os.waitstatus_to_exitcode (3.9) says it: a signal's number, negative
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if time.monotonic() > deadline:
            _kill(pid)
            return None
        time.sleep(0.05)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        pass


def _export_merged(torch: Any, model: Any, path: str, exporter: str, unmerge: bool = True) -> None:
    """:func:`_export`, a peft model's LoRA merged into its base weights for it and its attention computed as
    written out (transformers' ``eager``) rather than by torch's fused kernel (restored after, if asked)."""
    merged = hasattr(model, "merge_adapter")
    if merged:
        model.merge_adapter()
    attention = _written_out_attention(model)
    try:
        _export(torch, model, path, exporter)
    finally:
        if unmerge:
            if attention:
                model.set_attn_implementation(attention)
            if merged:
                model.unmerge_adapter()


def _written_out_attention(model: Any) -> Optional[str]:
    """Switch ``model`` to transformers' ``eager`` attention; the implementation it had (None: not switched).

    The fused kernel (``sdpa``, transformers' default) is traced as plain
    operators anyway, with a mask built for it that ONNX Runtime runs slowly:
    the graph of the ``eager`` one predicted 15 % more items a second with
    15 MB less memory (bench/predict_throughput.py's MiniLM, 600 reviews).
    """
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if before in (None, "eager") or not hasattr(model, "set_attn_implementation"):
        return None
    try:
        model.set_attn_implementation("eager")
    except Exception:  # a model without it exports as it is
        return None
    return before


def _export(torch: Any, model: Any, path: str, exporter: str) -> None:
    """Write ``model`` to ``path`` in ONNX through torch's ``exporter``, its outputs the logits, and beside it
    the logits ONNX Runtime must give on :func:`_check_batch` (``CHECK_LOGITS``, for :func:`_same_as_torch`)."""
    import contextlib
    import io
    import logging

    ids = torch.ones((2, 16), dtype=torch.long)
    # A padded row: transformers drops the attention mask where it is all ones, and the export would keep
    # that branch for every batch.
    mask = torch.ones((2, 16), dtype=torch.long)
    mask[1, 8:] = 0
    names = dict(input_names=["input_ids", "attention_mask"], output_names=["logits"])
    # The exporters report their steps on stdout, warn of what they trace as constants and log what they skip
    # (torchvision's operators): all of it would land in the worker's log.
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            if exporter == "torchscript":
                torch.onnx.export(model, (ids, mask), path, dynamo=False, **names, dynamic_axes={
                    "input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"},
                    "logits": {0: "batch"}})
            else:
                batch, tokens = torch.export.Dim("batch"), torch.export.Dim("tokens")
                torch.onnx.export(model, (), path, kwargs={"input_ids": ids, "attention_mask": mask}, dynamo=True,
                                  verbose=False, **names, dynamic_shapes={
                                      "input_ids": {0: batch, 1: tokens}, "attention_mask": {0: batch, 1: tokens}})
    finally:
        exporter_log.setLevel(level)
    with torch.no_grad():
        ids, mask = _check_batch(torch)
        torch.save(model(input_ids=ids, attention_mask=mask).logits.float(), path + CHECK_LOGITS)


def _check_batch(torch: Any) -> Tuple[Any, Any]:
    """Token ids and their mask of another shape than the traced batch's, one row padded."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (3, 37), generator=generator)  # ordinary tokens in any vocabulary
    mask = torch.ones_like(ids)
    mask[2, 20:] = 0
    return ids, mask


def _same_as_torch(torch: Any, path: str, session: Any) -> None:
    """Raise unless ``session`` gives the logits the model gave where it was exported to ``path`` (in the
    export's child: the worker's copy of the weights stays untouched, in page cache) on :func:`_check_batch`."""
    expected = torch.load(path + CHECK_LOGITS, weights_only=True)
    ids, mask = _check_batch(torch)
    got = torch.from_numpy(session.logits(ids.numpy(), mask.numpy()))
    if got.shape != expected.shape:
        raise ExportFailed("its graph gives logits of shape {} for {} on a batch of another shape".format(
            tuple(got.shape), tuple(expected.shape)))
    apart = float((got - expected).abs().max())
    if not apart <= EXPORT_TOLERANCE:  # NaN too
        raise ExportFailed("its graph's logits are {:.2g} from the model's on a batch of another shape".format(apart))


# -- the check against fp32 ------------------------------------------------------


def check_sample(order: Sequence[int], want: int) -> Tuple[List[int], List[int]]:
    """``(sample, rest)`` of ``order`` (longest texts first): every k-th item, about ``want`` of them,
    so the sample has long and short texts alike. Empty sample when the items are too few for a fast
    path to pay for predicting the sample twice (at most twice ``want``)."""
    if len(order) <= 2 * want:
        return [], list(order)
    stride = len(order) / float(want)
    picked = {int(k * stride) for k in range(want)}
    return ([i for n, i in enumerate(order) if n in picked], [i for n, i in enumerate(order) if n not in picked])


def tie_gap(probs: Sequence[float]) -> float:
    """How far apart a prediction's two likeliest labels are (1.0 with a single label)."""
    top = sorted(probs, reverse=True)[:2]
    return top[0] - (top[1] if len(top) > 1 else 0.0)


class FastPathCheck:
    """What a fast path (int8, ONNX Runtime) does to one schema's sample, and the decision it leads to.

    Feed it each sample item's fp32 and fast probabilities with :meth:`add`;
    :meth:`decide` sets :attr:`use_fast` and :attr:`redo_gap` (an item whose
    :func:`tie_gap` on the fast path is at most this is predicted again in
    fp32). The counts of what ran are kept for :meth:`describe`. ``path``: the
    fast path (``FAST_PATHS``); :attr:`sample_size`, how many items its sample takes.
    """

    def __init__(self, path: str = "int8") -> None:
        self.path = FAST_PATH_NAMES[path]
        self.sample_size = CHECK_ITEMS[path]
        self.pairs = []  # type: List[Tuple[List[float], List[float]]]
        self.use_fast = False
        self.redo_gap = 0.0
        self.reason = ""
        self.mean_change = 0.0
        self.fast_items = 0
        self.redone = 0

    def add(self, fp32: Sequence[float], fast: Sequence[float]) -> None:
        self.pairs.append((list(fp32), list(fast)))

    def refuse(self, reason: str) -> None:
        """Not the fast path for this schema, for ``reason`` (the run log's words)."""
        self.use_fast, self.reason = False, reason

    def decide(self, fp32_seconds: float, fast_seconds: float) -> bool:
        """Whether the other items may take the fast path (also sets :attr:`use_fast`); the seconds are
        what the sample took each way."""
        n, path = len(self.pairs), self.path
        self.use_fast = False
        if not n:
            self.reason = "too few items for {} to pay for its check".format(path)
            return False
        largest = max(max(abs(a - b) for a, b in zip(p, q)) for p, q in self.pairs)
        self.redo_gap = min(1.0, SAFETY * 2 * largest)
        # What each sample item's confidence would be off by: nothing where fp32 predicts it again.
        changes = [abs(max(p) - max(q)) if tie_gap(q) > self.redo_gap else 0.0 for p, q in self.pairs]
        self.mean_change = sum(changes) / n
        spread = math.sqrt(sum((c - self.mean_change) ** 2 for c in changes) / max(1, n - 1) / n)
        redo_share = sum(1 for p, q in self.pairs if tie_gap(q) <= self.redo_gap) / float(n)
        speedup = fp32_seconds / max(1e-9, fast_seconds + redo_share * fp32_seconds)
        if self.mean_change + 2 * spread > MAX_MEAN_CHANGE:
            self.reason = "on {} items predicted both ways {} moved confidences by {:.4f} on average " \
                          "(give or take {:.4f}), too close to {}".format(n, path, self.mean_change, spread,
                                                                          MAX_MEAN_CHANGE)
        elif speedup < MIN_SPEEDUP:
            self.reason = "on {} items predicted both ways {} took {:.0%} of fp32's time and {:.0%} of them were " \
                          "close enough to a tie to need fp32 again, so it would be only {:.2f}x as fast".format(
                              n, path, fast_seconds / max(1e-9, fp32_seconds), redo_share, speedup)
        else:
            self.use_fast = True
        return self.use_fast

    def describe(self) -> str:
        """The run log's words for what ran, after prediction."""
        n = len(self.pairs)
        if not self.use_fast:
            return "predicted in fp32: " + self.reason
        return ("predicted {} items in {path} and {} in fp32: {} both ways to check {path}, which, with the items "
                "close to a tie predicted in fp32, moved confidences by {:.4f} on average; {} more close to a tie "
                "(their two likeliest labels within {:.3f} in {path})".format(
                    self.fast_items - self.redone, n + self.redone, n, self.mean_change, self.redone,
                    self.redo_gap, path=self.path))


def checked_predictions(forward: Callable[[List[Any], bool], Any], sample: Iterable[List[Any]],
                        batches: Iterable[List[Any]], check: FastPathCheck, after_batch: Callable[[], None],
                        set_up: Callable[[], Optional[str]] = lambda: None,
                        tear_down: Callable[[], None] = lambda: None) -> Iterator[Tuple[Any, List[float]]]:
    """``(row, probabilities)`` for every row of ``sample``'s and then ``batches``' batches.

    ``forward(rows, fast)`` returns the rows' probabilities (a CPU tensor, one
    row each); ``after_batch`` runs after each batch (progress, cancel). The
    sample's batches are predicted in fp32 first; then ``set_up()`` readies
    the fast path (it returns None, or why it could not, and the schema stays
    in fp32) — after fp32's pass, so what fp32 needs can leave memory before
    the fast path takes its own (potato/training/trainers/hf_text_classification.py:
    the model's weights before ONNX Runtime's process starts) — and the
    sample is predicted on it; ``tear_down()`` frees what ``set_up`` took
    where the check keeps fp32. The sample's rows come out in fp32; the rest,
    as :class:`FastPathCheck` decides, on the fast path, but in fp32 for the
    rows it puts close to a tie.
    """
    sample = list(sample)  # a few batches (CHECK_ITEMS items), predicted twice
    fp32, fp32_seconds = [], 0.0
    for rows in sample:
        started = time.perf_counter()
        fp32.append(forward(rows, False).tolist())
        fp32_seconds += time.perf_counter() - started
        after_batch()  # the progress event, and what the batch freed goes back to the system
    why_not = set_up() if sample else None
    if why_not is not None:
        check.refuse(why_not)
    else:
        fast_seconds = 0.0
        for rows, probs in zip(sample, fp32):
            started = time.perf_counter()
            fast = forward(rows, True).tolist()
            fast_seconds += time.perf_counter() - started
            for p, q in zip(probs, fast):
                check.add(p, q)
        if not check.decide(fp32_seconds, fast_seconds):
            tear_down()
    for rows, probs in zip(sample, fp32):
        for row, p in zip(rows, probs):
            yield row, p
    for rows in batches:
        probs = forward(rows, check.use_fast).tolist()
        if check.use_fast:
            check.fast_items += len(rows)
            close = [k for k, p in enumerate(probs) if tie_gap(p) <= check.redo_gap]
            if close:
                check.redone += len(close)
                for k, p in zip(close, forward([rows[k] for k in close], False).tolist()):
                    probs[k] = p
        for row, p in zip(rows, probs):
            yield row, p
        after_batch()
