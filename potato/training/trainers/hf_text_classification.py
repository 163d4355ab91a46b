"""``hf-text-classification``: fine-tune a Hugging Face encoder to label item text.

One model per schema, trained one after the other, its output layer fitted to
the schema's kind of answer — one label, a point of a scale, a number or a set
of labels (potato/training/trainers/hf_heads.py says how each is trained and decoded).
(A shared encoder with one head per schema would train once for all schemas,
but its artifacts would not load with ``AutoModelForSequenceClassification`` /
``PeftModel`` as they are, one schema's labels could not be retrained
alone, and runs usually name one schema — so each schema gets its own model.)

Full fine-tune by default; ``lora`` (a mapping) trains a LoRA adapter with
peft instead. The optimisation is transformers' ``Trainer``'s (fused AdamW,
linear decay, gradient clipping at 1.0); the speed comes from not computing
on padding. Review-like text is long-tailed — most items are short, a few run
to ``max_length`` — and a random batch is padded to its longest item, so a
plain loop spends most of its time on pad tokens (bench/trainer_throughput.py
measures it). Here:

- training batches are length-grouped (shuffled groups of similar length,
  batch order shuffled: accuracy does not suffer) and padded per batch;
- prediction sorts items by length, batches them by a budget of padded
  tokens, tokenizes each batch when it is needed and streams predictions to
  disk, so memory stays flat however many items there are;
- on CUDA: bf16 autocast where the GPU has it (fp16 with loss scaling
  before Ampere), TF32 matmuls, pinned memory and non-blocking copies,
  padding to multiples of 8 for the tensor cores; the CPU trains in fp32;
- prediction uses the same autocast as training on CUDA, and bf16 autocast on
  a CPU with bf16 instructions (AVX512-BF16 or AMX), where the matmuls that
  are nearly all of its time run at about twice fp32's rate. What it changes,
  measured with bench/predict_precision.py (MiniLM trained on 400 reviews,
  2 000 predicted): 1 label of 2 000 differs from fp32's, confidences move by
  0.0003 on average (0.0026 at most), accuracy 0.9100 against 0.9095. A CPU
  without them would emulate bf16, slower than fp32; there prediction runs
  the model exported to ONNX Runtime where it is installed (else the linear
  layers in int8) where a check against fp32 on a sample of the schema's
  items allows it (potato/training/trainers/predict_precision.py says how), else in
  fp32; ``predict_precision: fp32`` asks for fp32 everywhere, ``onnx`` for
  ONNX Runtime and ``int8`` for int8 on every item, unchecked. These fast
  paths are for nominal schemas only: the check's margin is the gap between
  a softmax's two likeliest labels, which the other heads' outputs (a
  sigmoid per label or step, a number) do not have; they predict in fp32 on
  such a CPU.

Data-parallel runs (several GPUs; ``potato/training/data_parallel.py``) call
:func:`train` in every process with ``job.group``; the code path is the same.

Part of the remote half: importing this module loads only the standard
library; torch / transformers / peft are imported inside :func:`train`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from potato.training.answer_kinds import NOMINAL
from potato.training.trainers.answers import gold_answers
from potato.training.trainers.diverse_order import DiverseOrder, hidden_states
from potato.training.trainers.hf_common import (
    FINE_TUNE_OPTIONS,
    ComputeDevice,
    FineTune,
    build_encoder,
    build_model,
    check_fine_tune_options,
    describe_fit,
    estimated_tokens,
    fine_tune_options,
    pad_batch,
    safe_dirname,
    save_model,
    shard,
    start_fine_tune,
    token_budget_batches,
)
from potato.training.trainers.hf_heads import Head, make_head
from potato.training.trainers.metrics import KINDS, holdout_scores
from potato.training.trainers.onnx_session import SessionFailed
from potato.training.trainers.pooling import describe as describe_pooling
from potato.training.trainers.pooling import fit_probe, mean_pooled_classifier, pooling_of
from potato.training.trainers.pooling import options_problems as pooling_problems
from potato.training.trainers.predict_precision import (
    FAST_PATH_NAMES,
    PREDICT_PRECISIONS,
    FastPathCheck,
    Int8Linears,
    OnnxModel,
    check_sample,
    checked_predictions,
    page_out,
)
from potato.training.trainers.registry import TRAINERS
from potato.training.trainers.schedule import Validation, split_validation

NAME = "hf-text-classification"
REQUIRED_MODULES = TRAINERS[NAME].required_modules

# predict_precision: also "onnx" (ONNX Runtime on the CPU) and "int8" (int8 linear layers on the CPU), unchecked;
# "auto" checks the first of them this machine runs against fp32 on a CPU without bf16.
# pooling: how the classifier reads the encoder (potato/training/trainers/pooling.py): auto, mean or cls.
DEFAULT_OPTIONS = dict(FINE_TUNE_OPTIONS, pooling="auto")  # type: Dict[str, Any]
# The kinds whose predictions may take a fast path: the check's margin (predict_precision.tie_gap) is a softmax's.
FAST_KINDS = ("nominal",)


# -- options -----------------------------------------------------------------


def check_options(options: Optional[Dict[str, Any]]) -> List[str]:
    """Problems with ``options`` as texts naming the key (empty when all is well)."""
    options, problems = check_fine_tune_options(options, DEFAULT_OPTIONS, NAME, PREDICT_PRECISIONS)
    return problems + pooling_problems(options)


def effective_options(options: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """``options`` over the defaults; ``lora`` becomes None or a full mapping, ``learning_rate`` a number."""
    return fine_tune_options(options, DEFAULT_OPTIONS)


# -- training ------------------------------------------------------------------


def train(job: Any, events: Any) -> None:
    """Train one model per schema of ``job``; write predictions, scores and artifacts.

    ``job`` is a :class:`potato.training.worker.Job`; ``events`` a
    :class:`potato.training.events.EventWriter`. Raises ``Cancelled`` when a
    stop is requested and :class:`TrainerFailure` for problems the user can fix.
    In a data-parallel run every process calls this with its own ``job.group``;
    rank 0 alone writes the run's files and its log lines.
    """
    ft = start_fine_tune(job, events, effective_options(job.options), NAME, fast=("onnx", "int8"))
    items = job.index_items()
    asked = ft.opts["pooling"]
    ft.opts["pooling"] = pooling = pooling_of(asked, ft.base_dir)
    ft.say(ft.model_line(len(items), extra=", pooling={}".format(describe_pooling(pooling, asked))))
    ft.each_schema(items, lambda schema, stream: _train_schema(ft, items, schema, stream))


def _train_schema(ft: FineTune, items: Any, schema: str, stream: Any) -> Dict[str, Any]:
    """Train, predict and save one schema's model; returns its holdout scores (with its learning curve when
    the options ask for one)."""
    import torch

    job, opts, group = ft.job, ft.opts, ft.group
    head = make_head(ft.answers[schema])
    answers = head.answers
    labelled = gold_answers(items, answers)
    golds = labelled.golds
    ft.say(labelled.describe(answers))
    model = _fit(ft, items, schema, head, golds, labelled.train)

    is_holdout = set(labelled.holdout)
    held = {}  # type: Dict[int, Any]
    diverse = DiverseOrder(job, schema, answers.kind, len(answers.labels))
    check = (FastPathCheck(ft.dev.predict_fast)
             if ft.dev.predict_fast and ft.dev.predict_checked and answers.kind in FAST_KINDS else None)
    for (i, (item_id, _)), out in _predict_items(model, ft, items, labelled.to_predict(items, job.include_unlabeled),
                                                 schema, head, check):
        record = {"id": item_id, "schema": schema}
        record.update(head.record(out, i in is_holdout))
        if i in is_holdout:
            held[i] = head.answer(out)
        stream.write(record)
        diverse.observe(i, record, i not in golds)
    if check:
        ft.say("Schema {!r}: {}".format(schema, check.describe()))
    if diverse.on:
        diverse.numbers = ft.gather(diverse.numbers)
        if group.is_main:
            diverse.write(torch, stream, items, ft.dev.device, opts["max_length"], ft.tokenizer,
                          hidden_states(model), ft.say, ft.events.check_cancelled)
    held = ft.gather(held)
    scores = holdout_scores([golds[i] for i in labelled.holdout], [held[i] for i in labelled.holdout],
                            answers.kind, answers.labels)
    if group.is_main:
        out_dir = os.path.join(job.artifacts_dir, safe_dirname(schema))
        save_model(model, ft, out_dir, {"trainer": NAME, "schema": schema, "labels": answers.labels,
                                        "answers": head.saved(), "pooling": opts["pooling"]})
        ft.say("Schema {!r}: holdout {}; model saved to {}".format(schema, scores, out_dir))
    if opts["curve"] and labelled.holdout:
        del model

        def curve_point(share: float, train: List[int]) -> Dict[str, Any]:
            fresh = make_head(answers)  # its own thresholds, where the head tunes them
            return _holdout_scores(ft, items, schema, labelled, _fit(ft, items, schema, fresh, golds, train, share),
                                   fresh)

        scores["curve"] = ft.learning_curve(schema, labelled.train, scores, answers.kind, curve_point)
    return scores


def _fit(ft: FineTune, items: Any, schema: str, head: Head, golds: Dict[int, Any], train: List[int],
         curve: Optional[float] = None) -> Any:
    """A model of ``head`` trained on the items ``train``: a validation share carved from them, its decision
    tuned where the head tunes one. ``curve``: a point of the learning curve, trained on that share of the
    labels for no more epochs than the whole run (``FineTune.learning_curve``)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    opts = ft.opts
    answers = head.answers
    fit_idx, tune_idx = head.split(train, opts["seed"])
    fit_idx, val_idx = split_validation(fit_idx, opts, golds.get if answers.kind == NOMINAL else None)
    outputs = head.id2label()
    train_ids = _token_ids(ft, items, fit_idx)
    targets = [head.target(golds[i]) for i in fit_idx]
    mean = opts["pooling"] == "mean"
    if mean:  # the mean of the token states, its head starting as the linear probe on the frozen encoder
        model = mean_pooled_classifier(torch, build_encoder(ft), head.num_outputs)
        _fit_linear_probe(ft, model, train_ids, targets, head)
    else:
        model = build_model(AutoModelForSequenceClassification, "SEQ_CLS", ft,
                            [outputs[k] for k in sorted(outputs)], head.problem_type)
    main = KINDS[answers.kind].main
    model = ft.train(model, [len(ids) for ids in train_ids], _batch_loss(train_ids, targets, ft, head), schema,
                     _validation(ft, items, val_idx, golds, head), main.name, validate_first=mean, curve=curve)
    if curve is None:
        ft.say("Schema {!r}: {}".format(schema, describe_fit(ft, len(fit_idx), len(val_idx))))
    ft.events.check_cancelled()
    if tune_idx:  # with no check, so in fp32 (or bf16) on every device: thresholds are tuned on what fp32 says
        tuned = ft.gather({i: out for (i, _), out in _predict_items(model, ft, items, tune_idx, schema, head)})
        note = head.tune([tuned[i] for i in tune_idx], [golds[i] for i in tune_idx])
        if note and curve is None:
            ft.say("Schema {!r}: {}".format(schema, note))
    return model


def _holdout_scores(ft: FineTune, items: Any, schema: str, labelled: Any, model: Any, head: Head) -> Dict[str, Any]:
    """``model``'s scores on the held-out items (predicted in fp32, or bf16: no fast path for a curve's point)."""
    held = ft.gather({i: head.answer(out) for (i, _), out in _predict_items(model, ft, items, labelled.holdout,
                                                                            schema, head)})
    return holdout_scores([labelled.golds[i] for i in labelled.holdout], [held[i] for i in labelled.holdout],
                          head.answers.kind, head.answers.labels)


def _fit_linear_probe(ft: FineTune, model: Any, ids: List[List[int]], targets: List[Any], head: Head) -> None:
    """Start ``model``'s head as the linear probe: the head's loss fitted on the frozen encoder's mean
    token states of the training texts (``potato.training.trainers.pooling.fit_probe``)."""
    import torch

    model.to(ft.dev.device)
    model.eval()
    order = sorted(range(len(ids)), key=lambda k: len(ids[k]), reverse=True)
    features = [None] * len(ids)  # type: List[Any]
    with torch.inference_mode():
        for batch in token_budget_batches(order, lambda k: len(ids[k]), ft.dev.predict_budget, ft.dev.predict_rows):
            padded, mask = pad_batch([ids[k] for k in batch], ft.pad_id, ft.dev.pad_multiple)
            with ft.dev.autocast():
                found = model.features(ft.dev.put(padded), ft.dev.put(mask)).float()
            for k, row in zip(batch, found):
                features[k] = row
    fit_probe(torch, torch.stack(features).clone(), ft.dev.put(head.targets(torch, targets)), head.loss,
              model.classifier)
    model.train()


def _token_ids(ft: FineTune, items: Any, positions: List[int]) -> List[List[int]]:
    return ft.tokenizer([items.read(i)[1] for i in positions], truncation=True,
                        max_length=ft.opts["max_length"])["input_ids"]


def _validation(ft: FineTune, items: Any, positions: List[int], golds: Dict[int, Any], head: Head) -> Optional[Any]:
    """The training loop's ``validate`` on the validation share at ``positions`` (None without one): the
    schema's main metric (``potato.training.trainers.metrics``) and the mean loss, in training's precision."""
    if not positions:
        return None
    import torch

    answers = head.answers
    ids = _token_ids(ft, items, positions)
    order = sorted(range(len(ids)), key=lambda k: len(ids[k]), reverse=True)
    batches = token_budget_batches(order, lambda k: len(ids[k]), ft.dev.predict_budget, ft.dev.predict_rows)
    main = KINDS[answers.kind].main

    def validate(model: Any) -> Validation:
        loss, answered = 0.0, {}  # type: float, Dict[int, Any]
        for batch in batches:
            logits = ft.logits(model, [ids[k] for k in batch]).float()
            y = ft.dev.put(head.targets(torch, [head.target(golds[positions[k]]) for k in batch]))
            loss += float(head.loss(torch, logits, y))
            for k, out in zip(batch, head.activate(torch, logits).cpu().tolist()):
                answered[k] = head.answer(out)
        scores = holdout_scores([golds[i] for i in positions], [answered[k] for k in range(len(ids))],
                                answers.kind, answers.labels)
        value = main.of(scores) or 0.0
        return Validation(main.better_is_higher(value), loss / len(ids), value)

    return validate


def _batch_loss(train_ids: List[List[int]], targets: List[Any], ft: FineTune, head: Head):
    """The loop's ``batch_loss``: the head's loss on the texts ``mine``, a share of the step's mean."""
    import torch

    def batch_loss(model: Any, mine: List[int], step: List[int], weight: float) -> Any:
        logits = ft.logits(model, [train_ids[k] for k in mine])
        y = ft.dev.put(head.targets(torch, [targets[k] for k in mine]))
        return head.loss(torch, logits.float(), y) * (weight / len(step))

    return batch_loss


def _predict_items(model: Any, ft: FineTune, items: Any, positions: List[int], schema: str, head: Head,
                   check: Optional[FastPathCheck] = None) -> Iterator[Tuple[Tuple[int, Tuple[Any, str]], List[float]]]:
    """:func:`predict` on this process's share of the items at ``positions``, longest texts first,
    their texts read from the bundle batch by batch; with ``check``, a sample of them first (see
    :func:`predict`)."""
    dev, max_length = ft.dev, ft.opts["max_length"]
    mine = shard(sorted(positions, key=lambda i: items.text_lengths[i], reverse=True), ft.group)
    sample, mine = check_sample(mine, check.sample_size) if check else ([], mine)
    sample, batches = [token_budget_batches(
        order, lambda i: estimated_tokens(items.text_lengths[i], max_length, dev.predict_pad_multiple),
        dev.predict_budget, dev.predict_rows) for order in (sample, mine)]
    dev.release()  # what training freed goes back to the system before prediction starts
    return predict(model, ft.tokenizer, _read_rows(items, batches), len(sample) + len(batches), max_length, dev,
                   ft.events, schema, head, _read_rows(items, sample), check, ft.job.dir)


def _read_rows(items: Any, batches: List[List[int]]) -> Iterator[List[Tuple[int, Tuple[Any, str]]]]:
    """Each batch's ``(position, (id, text))`` rows, read from the bundle when the batch's turn comes."""
    return ([(i, items.read(i)) for i in batch] for batch in batches)


def predict(model: Any, tokenizer: Any, batches: Iterable[List[Tuple[Any, Tuple[Any, str]]]], total: int,
            max_length: int, dev: ComputeDevice, events: Any, schema: str, head: Head,
            sample: Iterable[List[Tuple[Any, Tuple[Any, str]]]] = (),
            check: Optional[FastPathCheck] = None, work_dir: Optional[str] = None) -> Iterator[Tuple[Any, List[float]]]:
    """``(key, outputs)`` for each ``(key, (id, text))`` of ``batches``: the head's outputs for the
    text (for a nominal schema the probability of each label).

    The caller makes the batches (longest texts first, a budget of padded
    tokens each: see :func:`token_budget_batches`) and may read their texts
    only as they are needed; each batch is tokenized here when its turn comes,
    so memory does not grow with the number of items. ``total``: the number
    of batches, for the progress events. With ``check`` (a fast path checked
    against fp32: ``dev.predict_checked``, a nominal schema), ``sample``'s
    batches come first, predicted both ways (see :func:`checked_predictions`);
    without one, such a device predicts in fp32. A fast path asked for by name
    (``predict_precision: onnx`` or ``int8``) runs on every item of a nominal
    schema only. The ONNX export goes into a directory of its own under
    ``work_dir`` (the job's directory; the system's temporary one if None),
    deleted when prediction ends; ONNX Runtime predicts in a process of its
    own, and the model's weights here move to page cache before the export
    (:func:`page_out`). Should that process stop, the other items predict in
    fp32 here, with a warning.
    """
    import torch

    model.eval()
    step = [0]
    path = dev.predict_fast
    name = FAST_PATH_NAMES.get(path or "")

    session_lost = []  # type: List[str]  # why ONNX Runtime's process stopped, once it has

    def forward(rows: List[Any], fast: bool) -> Any:
        events.check_cancelled()
        enc = tokenizer([text for _, (_, text) in rows], truncation=True, max_length=max_length, padding=True,
                        pad_to_multiple_of=dev.predict_pad_multiple if dev.predict_pad_multiple > 1 else None,
                        return_tensors="pt")
        if fast and path == "onnx" and not session_lost:
            try:
                logits = torch.from_numpy(runner.logits(enc["input_ids"], enc["attention_mask"]))
                return head.activate(torch, logits.float())
            except SessionFailed as exc:  # killed for memory, say: the model here still predicts
                events.check_cancelled()  # a stop's SIGTERM reaches that process too
                session_lost.append(str(exc))
                events.log("Schema {!r}: ONNX Runtime stopped ({}); the other items predict in fp32".format(
                    schema, exc), level="warning")
        with runner.on() if fast and path == "int8" else contextlib.nullcontext(), dev.predict_autocast():
            ids, mask = dev.put(enc["input_ids"]), dev.put(enc["attention_mask"])
            logits = model(input_ids=ids, attention_mask=mask).logits
        return head.activate(torch, logits.float()).cpu()

    def after_batch() -> None:
        step[0] += 1
        events.progress("predict", step[0], total, schema=schema)
        dev.release()

    runner = contextlib.nullcontext()  # type: Any
    if dev.predict_checked and check is None:
        path = None  # a caller with no check predicts in fp32 (thresholds are tuned on what fp32 says)
    elif path and head.answers.kind not in FAST_KINDS:
        path = None
        if not dev.predict_checked:
            events.log("Schema {!r}: predicts in fp32: {} is for nominal schemas only".format(schema, name),
                       level="warning")

    def set_up(stack: contextlib.ExitStack) -> Optional[str]:
        """Ready the fast path (its runner closed with ``stack``); why it could not be (None: it is)."""
        nonlocal runner
        if path == "onnx":
            # ONNX Runtime's process gets its own copy: the worker's goes to page cache (predict_precision.page_out).
            page_out(torch, model, work_dir)
        try:
            runner = stack.enter_context(OnnxModel(torch, model, work_dir, torch.get_num_threads())
                                         if path == "onnx" else Int8Linears(torch, model))
        except Exception as exc:  # a torch or exporter that changed: fp32 rather than a failed run
            return "{} could not be set up here: {}".format(name, (str(exc).strip().splitlines()
                                                                   or [type(exc).__name__])[0])
        if path == "onnx":
            events.log("Schema {!r}: exported to ONNX by torch's {} exporter in {:.1f} s".format(
                schema, runner.exporter, runner.seconds))
        return None

    with torch.inference_mode(), contextlib.ExitStack() as stack:
        if path and dev.predict_checked:
            yield from checked_predictions(forward, sample, batches, check, after_batch, lambda: set_up(stack),
                                           stack.close)  # refused: ONNX Runtime's process ends at once
            return
        if path:  # asked for by name: on every item, unchecked
            why_not = set_up(stack)
            if why_not:
                path = None
                events.log("Schema {!r}: predicts in fp32: {}".format(schema, why_not), level="warning")
        # fp32 (or bf16) unless a fast path was asked for; a caller with no check gets no unchecked one
        yield from _unchecked(forward, itertools.chain(sample, batches), bool(path), after_batch)


def _unchecked(forward: Callable[[List[Any], bool], Any], batches: Iterable[List[Any]], fast: bool,
               after_batch: Callable[[], None]) -> Iterator[Tuple[Any, List[float]]]:
    for rows in batches:
        for row, outputs in zip(rows, forward(rows, fast).tolist()):
            yield row, outputs
        after_batch()
