"""What the Hugging Face trainers share: finding the model, batching by length, the compute device.

Every trainer that fine-tunes a transformers model (``hf-text-classification``
and those built like it) takes these from here, so a fix to how a model is
found offline, how batches are cut or how a device computes reaches all of
them. The numbers (``GROUP_BATCHES``, ``PREDICT_BUDGET``, the padding steps)
were measured with bench/trainer_throughput.py and bench/predict_throughput.py;
each says what it was measured against.

Part of the remote half: importing this module loads only the standard
library; torch and transformers are passed in or imported inside functions.
"""

from __future__ import annotations

import os
import random
import re
from typing import Any, Callable, List, Optional, Sequence, Tuple

from potato.trainers.predict_precision import cpu_has_bf16, int8_unavailable
from potato.training.events import TrainerFailure

# Training batches are sorted by length within random groups of this many batches. transformers'
# LengthGroupedSampler takes 50, which on a few hundred labels sorts the whole set: measured on
# bench/trainer_throughput.py's 400 reviews (LoRA, seeds 42/1/2), groups of 50 scored 0.953/0.967/0.969
# on the holdout, groups of 8 0.964/0.975/0.968 (the Trainer: 0.968 at seed 42), keeping 2.6x of the
# 3.2x fewer padded tokens.
GROUP_BATCHES = 8

# Prediction batches: at most this many padded tokens and rows, per kind of device. A CPU that
# computes in fp32 or int8 (no bf16) takes smaller batches, whose activations stay in its caches:
# MiniLM on AVX2 kernels, 300 reviews, items per CPU second at 4096 / 2048 / 1024 tokens: fp32
# 45.8 / 50.2 / 50.3, int8 79.1 / 82.8 / 84.3, and peak RSS 612-647 / 582 / 543 MB.
PREDICT_BUDGET = {"cpu": (1024, 256), "cpu-bf16": (4096, 256), "cuda": (65536, 1024)}


# -- the model -----------------------------------------------------------------


def hub_offline() -> bool:
    """Whether Hugging Face Hub downloads are switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def resolve_model(model: str) -> Tuple[str, str]:
    """(what to pass to ``from_pretrained``, the model's absolute local directory).

    Raises :class:`TrainerFailure` at once for a missing directory, or for a
    hub id that is not in the local cache while downloads are off.
    """
    expanded = os.path.expanduser(model)
    if os.path.isdir(expanded):
        path = os.path.abspath(expanded)
        return path, path
    if os.path.isabs(expanded) or model.startswith((".", "~")) or os.path.exists(expanded) or model.count("/") > 1:
        raise TrainerFailure(
            "model {!r} is not a directory on this machine; set model to a model directory "
            "here or to a Hugging Face hub id".format(model)
        )
    from transformers.utils import cached_file

    offline = hub_offline()
    try:
        config_file = cached_file(model, "config.json", local_files_only=offline)
    except Exception as exc:  # OSError, or ValueError/HF errors for odd ids
        if offline:
            raise TrainerFailure(
                "The model {m!r} is not on this machine and Hugging Face Hub downloads are off "
                "(HF_HUB_OFFLINE=1): download it on a machine with network access "
                "(`hf download {m} --local-dir DIR`), copy DIR here and set model to that "
                "directory".format(m=model)
            )
        raise TrainerFailure(
            "The model {!r} could not be loaded from the Hugging Face Hub: {}".format(
                model, (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            )
        )
    return model, os.path.dirname(os.path.abspath(config_file))


def model_max_length(tokenizer: Any, config: Any) -> Optional[int]:
    """The most tokens the model takes: the tokenizer's limit or the position embeddings', whichever
    is smaller (RoBERTa has 514 positions for 512 tokens; a tokenizer may not say at all)."""
    candidates = (getattr(tokenizer, "model_max_length", None), getattr(config, "max_position_embeddings", None))
    limits = [n for n in candidates if isinstance(n, int) and 0 < n < 1_000_000]
    return min(limits) if limits else None


def dtype_keyword() -> str:
    """``dtype`` (transformers >= 4.56) or ``torch_dtype`` (older) for ``from_pretrained``."""
    import transformers

    parts = re.findall(r"\d+", transformers.__version__)[:2]
    return "dtype" if tuple(int(p) for p in parts) >= (4, 56) else "torch_dtype"


def safe_dirname(schema: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", schema).strip("._")
    return name or "schema"


# -- batches (pure Python) -------------------------------------------------------


def length_grouped_batches(lengths: Sequence[int], batch_size: int, rng: random.Random,
                           group_batches: int = GROUP_BATCHES) -> List[List[int]]:
    """One epoch's batches of positions into ``lengths``: shuffled, but each batch of similar lengths.

    The positions are shuffled, cut into groups of ``group_batches`` batches,
    each group sorted by length and cut into batches, and the batches
    shuffled again — so a batch is padded only to its own longest text, while
    which texts meet in a batch and the order of batches stay random (what
    transformers' ``LengthGroupedSampler`` does). The batch holding the longest
    text goes first, so a batch size that does not fit in memory fails at the
    first step, not near the end.
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    span = batch_size * group_batches
    batches = []
    for start in range(0, len(order), span):
        group = sorted(order[start:start + span], key=lambda k: lengths[k], reverse=True)
        batches.extend(group[i:i + batch_size] for i in range(0, len(group), batch_size))
    rng.shuffle(batches)
    if batches:
        longest = max(range(len(batches)), key=lambda b: max(lengths[k] for k in batches[b]))
        batches.insert(0, batches.pop(longest))
    return batches


def token_budget_batches(order: Sequence[int], tokens: Callable[[int], int], budget: int,
                         max_rows: int) -> List[List[int]]:
    """Cut ``order`` (longest first) into batches of at most ``budget`` padded tokens and ``max_rows`` rows.

    ``tokens(i)`` is item ``i``'s length in tokens; a batch is padded to its first (longest) item's.
    """
    batches, start = [], 0
    while start < len(order):
        rows = max(1, min(max_rows, budget // max(1, tokens(order[start]))))
        batches.append(list(order[start:start + rows]))
        start += rows
    return batches


def estimated_tokens(text_length: int, max_length: int, multiple: int = 1) -> int:
    """A word-piece count from a text's length in characters (~4 a piece), for sorting and budgets;
    rounded up to ``multiple``, as the batch it is in will be padded."""
    tokens = min(max_length, text_length // 4 + 2)
    return tokens + (-tokens % multiple)


def shard(order: List[int], group: Any) -> List[int]:
    """This process's share of ``order``: every ``size``-th, so each gets long and short texts alike."""
    return order if group.size == 1 else order[group.rank::group.size]


def pad_batch(seqs: List[List[int]], pad_id: int, multiple: int):
    """``(input_ids, attention_mask)`` CPU tensors, padded to the longest of ``seqs`` (rounded up to ``multiple``)."""
    import torch

    width = max(len(s) for s in seqs)
    width += -width % multiple
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, :len(seq)] = 1
    return ids, mask


# -- the device ----------------------------------------------------------------


class ComputeDevice:
    """The torch device and how to compute on it: mixed precision, padding, batch sizes."""

    def __init__(self, torch: Any, name: str, predict_precision: str = "auto"):
        self.torch = torch
        self.device = torch.device(name)
        self.cuda = self.device.type == "cuda"
        self.dtype = None  # training's autocast dtype; None: full precision
        self.scaler = None
        if self.cuda:
            torch.set_float32_matmul_precision("high")  # TF32 matmuls on Ampere and later
            if torch.cuda.is_bf16_supported():
                self.dtype = torch.bfloat16
            else:  # before Ampere: fp16, whose small range needs loss scaling
                self.dtype = torch.float16
                self.scaler = torch.amp.GradScaler("cuda")
        self.predict_dtype = None  # prediction's autocast dtype
        # int8 linear layers on the CPU (potato/trainers/predict_precision.py): "checked" against fp32
        # item by item (auto, on a CPU without bf16), "always" (predict_precision: int8), or None.
        self.predict_int8 = None  # type: Optional[str]
        self._asked = predict_precision
        self._no_int8 = None  # type: Optional[str]
        if predict_precision != "fp32":
            if self.cuda:
                self.predict_dtype = self.dtype
            elif self.device.type == "cpu":
                if predict_precision == "int8":
                    self.predict_int8 = "always"
                elif cpu_has_bf16(torch):
                    self.predict_dtype = torch.bfloat16
                else:
                    self.predict_int8 = "checked"
        if self.predict_int8:
            self._no_int8 = int8_unavailable(torch)
            if self._no_int8:
                self.predict_int8 = None
        # Tensor cores take matrices in multiples of 8; the CPU gains nothing from it.
        self.pad_multiple = 8 if self.cuda else 1
        # oneDNN's bf16 kernels are built and cached per matrix shape: batches of every width and row
        # count made the worker's peak RSS grow with the number of items (tiny model, 1 000 -> 30 000
        # items: 407 -> 810 MB). Widths (and the rows a budget gives) in steps of 16 keep the shapes
        # few: 398 -> 418 MB at the same speed; MiniLM 1 000 -> 20 000 items: 745 -> 743 MB.
        self.predict_pad_multiple = 16 if self.predict_dtype is not None and not self.cuda else self.pad_multiple
        self.predict_budget, self.predict_rows = PREDICT_BUDGET[
            "cuda" if self.cuda else "cpu-bf16" if self.predict_dtype is not None else "cpu"]
        self._trim = None if self.cuda else _malloc_trim()

    def fit_padding(self, max_length: int, limit: Optional[int]) -> None:
        """Pad to no multiple that would take a batch of ``max_length`` tokens past the model's ``limit``
        of positions (a model's position embeddings end there; None: unknown, so at ``max_length``)."""
        for name in ("pad_multiple", "predict_pad_multiple"):
            multiple = getattr(self, name)
            if max_length + (-max_length % multiple) > (limit or max_length):
                setattr(self, name, 1)

    @property
    def precision(self) -> str:
        """How training computes, for the log: ``full precision (fp32)``, ``bf16 autocast``, ..."""
        if self.dtype is None:
            return "full precision (fp32)"
        torch = self.torch
        return "bf16 autocast" if self.dtype == torch.bfloat16 else "fp16 autocast with loss scaling"

    @property
    def predict_precision(self) -> str:
        """How prediction computes, for the log."""
        if self.predict_int8 == "always":
            return "int8 (its linear layers quantized, as predict_precision asks)"
        if self.predict_int8 == "checked":
            return "int8 where it agrees with fp32, checked per schema (the CPU has no bf16 instructions)"
        if self.predict_dtype is None:
            return "fp32" + (" ({})".format(self._no_int8) if self._no_int8 else "")
        name = "bf16" if self.predict_dtype == self.torch.bfloat16 else "fp16"
        if not self.cuda:
            return name + " autocast (the CPU has bf16 instructions)"
        return name + " autocast" + (" (int8 is for CPUs)" if self._asked == "int8" else "")

    def autocast(self):
        """Training's mixed precision (none on the CPU)."""
        return self._autocast(self.dtype)

    def predict_autocast(self):
        return self._autocast(self.predict_dtype)

    def _autocast(self, dtype: Any):
        import contextlib

        if dtype is None:
            return contextlib.nullcontext()
        return self.torch.autocast(device_type=self.device.type, dtype=dtype)

    def release(self) -> None:
        """Hand freed memory back to the system (CPU only; see :func:`_malloc_trim`)."""
        if self._trim is not None:
            self._trim(0)

    def put(self, tensor: Any) -> Any:
        """``tensor`` on the device; from pinned memory, so the copy overlaps the GPU's work."""
        if self.cuda:
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor


def _malloc_trim() -> Optional[Callable[[int], int]]:
    """glibc's ``malloc_trim``, where there is one.

    Batches of varying shape on the CPU leave glibc's heap fragmented: measured
    with bench/predict_throughput.py's worker (tiny model), peak RSS grew by
    55 MB from 1 000 to 50 000 predicted items; trimming after each batch kept
    the growth under 3 MB, at no measurable cost in speed.
    """
    try:
        import ctypes

        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl)
        return None


def adamw(params: List[Any], lr: float):
    import torch

    try:  # fused: one kernel per step (transformers' Trainer uses it too)
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
