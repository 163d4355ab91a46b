"""``hf-llm-finetune``: LoRA on a causal language model whose base weights are loaded in 4 bits.

One LoRA adapter per schema, trained one after the other on the same base
model (the adapter is unloaded between schemas, so the base is loaded once).
Each labelled item becomes a prompt (``prompt_template`` or the default for
its kind, in the tokenizer's chat template when it has one) and the answer
its annotators gave (potato/training/trainers/llm_prompts.py says how each kind's
answer is written). The loss is the cross-entropy of the answer's tokens
only: the prompt's tokens are context, never targets.

How it predicts (potato/training/trainers/llm_decoding.py): radio and likert schemas
by scoring every label (so every item gets a label of the schema and a real
probability, the same shape of predictions as hf-text-classification's:
writeback, holdout scores, the reliability diagram and decision-calibrate
work unchanged); multiselect by a yes/no decision per label; text schemas
by greedy generation.

Base weights: ``load_in_4bit`` loads every linear layer as 4-bit NF4 (or
FP4) with bitsandbytes, double-quantized (QLoRA's recipe); the embeddings
and output layer stay 16-bit. Frozen weights are 16-bit on a GPU (bf16
where it computes bf16) and fp32 on the CPU; the adapter trains in fp32
under the device's autocast (potato/training/trainers/hf_common.py's
``ComputeDevice``). bench/llm_throughput.py measures it against TRL's
``SFTTrainer`` and ``pipeline("text-generation")`` (the tests' tiny Llama in
4-bit, 400 long-tailed reviews, one thread on a shared two-core CPU, medians
of 3 rounds): training 2.6x TRL's examples/s at 0.4x its peak RSS (508 against
1341 MB); prediction 2.7x the pipeline's items/s, with 796 of 800 labels the
same. Where the speed comes from:

- batches of similar length, padded per batch (left, so every answer ends
  in the same column);
- logits only for the answer's positions (``logits_to_keep``): the output
  layer over a 32 000-150 000-word vocabulary is about a tenth of an 8 B
  model's work per token and a quarter of a 0.5 B one's, and its logits
  (in fp32 for the loss) the largest tensor of a step, all for prompt
  positions the loss never reads;
- prediction runs each prompt once and scores the labels on its cache.

Data-parallel runs (several GPUs; ``potato/training/data_parallel.py``)
call :func:`train` in every process with ``job.group``, as for
hf-text-classification.

Part of the remote half: importing this module loads only the standard
library; torch, transformers, peft and bitsandbytes are imported inside
:func:`train`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any, Dict, List, Optional, Tuple

from potato.training.answer_kinds import COMPARISON, MULTILABEL, NOMINAL, SIDES, TEXT
from potato.training.events import OutOfGpuMemory, TrainerFailure
from potato.training.trainers.answers import SchemaAnswers, answers_of, gold_answers
from potato.training.trainers.hf_common import (
    ComputeDevice,
    FineTune,
    describe_fit,
    dtype_keyword,
    estimated_tokens,
    hub_offline,
    resolve_model,
    safe_dirname,
    shard,
    token_budget_batches,
    train_loop,
)
from potato.training.trainers.llm_batches import answer_logits
from potato.training.trainers.llm_decoding import logits_keyword
from potato.training.trainers.llm_memory import (
    bitsandbytes_missing_message,
    estimate_training_memory,
    first_line,
    four_bit_support,
    out_of_gpu_memory_message,
    parameter_counts,
    predict_token_budget,
    read_shape,
    too_little_memory_message,
)
from potato.training.trainers.llm_preference import (
    DEFAULT_BETA,
    DPO,
    SFT,
    Pairs,
    batch_loss,
    chosen_sign,
    log_likelihoods,
    objective_mismatch,
    objective_problems,
    rewards,
    validation,
)
from potato.training.trainers.llm_prompts import (
    DEFAULT_TEMPLATES,
    AnswerTokens,
    PromptFormat,
    PromptTooLong,
    fill,
    template_problems,
)
from potato.training.trainers.metrics import holdout_scores
from potato.training.trainers.options import (
    check_keys,
    learning_rate_problems,
    lora_problems,
    model_problems,
    positive_int_problems,
    seed_problems,
)
from potato.training.trainers.registry import TRAINERS, HostCheck
from potato.training.trainers.schedule import (
    SCHEDULE_OPTIONS,
    Validation,
    make_plan,
    schedule_problems,
    split_validation,
)

NAME = "hf-llm-finetune"
REQUIRED_MODULES = TRAINERS[NAME].required_modules

DEFAULT_LORA = {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": "all-linear"}
# A LoRA on an LLM learns an answer format in far fewer steps than an encoder learns a task from scratch, and
# each of its steps costs much more: its floor on steps is lower than the encoders' (schedule.MIN_STEPS).
LLM_MIN_STEPS = 100
DEFAULT_OPTIONS = dict(SCHEDULE_OPTIONS, min_steps=LLM_MIN_STEPS, **{
    "model": None,  # a local directory or a hub id; no default model ships
    "load_in_4bit": "auto",  # auto: where a CUDA GPU and a working bitsandbytes are; true works on the CPU too
    "bnb_4bit_quant_type": "nf4",
    "lora": None,  # a mapping of r, alpha, dropout, target_modules over DEFAULT_LORA
    "learning_rate": 2e-4,
    "batch_size": 8,
    "gradient_accumulation_steps": 1,
    "max_length": 512,
    "gradient_checkpointing": False,
    "prompt_template": None,  # None: DEFAULT_TEMPLATES for the schema's kind
    "max_new_tokens": 64,
    "merge": False,
    "objective": SFT,  # sft: learn the annotators' answers; dpo: learn which of two responses they preferred
    "beta": DEFAULT_BETA,  # dpo: how far the tuned model may move from the base (higher: less far)
    "seed": 42,
})  # type: Dict[str, Any]
QUANT_TYPES = ("nf4", "fp4")

NO_MODEL_MESSAGE = (
    "hf-llm-finetune has no model: set model_training.trainers.hf-llm-finetune.model in the config (or, for "
    "one run, --option model=…) to a local model directory or a Hugging Face hub id (no model ships with "
    "Potato; docs/trainers/hf-llm-finetune.md names some)"
)


# -- options -------------------------------------------------------------------


def check_options(options: Optional[Dict[str, Any]]) -> List[str]:
    """Problems with ``options`` as texts naming the key (empty when all is well)."""
    options, problems = check_keys(options, DEFAULT_OPTIONS, NAME)
    problems += model_problems(options)
    if "load_in_4bit" in options and options["load_in_4bit"] not in (True, False, "auto"):
        problems.append("load_in_4bit must be true, false or auto, got {!r}".format(options["load_in_4bit"]))
    if "bnb_4bit_quant_type" in options and options["bnb_4bit_quant_type"] not in QUANT_TYPES:
        problems.append("bnb_4bit_quant_type must be nf4 or fp4, got {!r}".format(options["bnb_4bit_quant_type"]))
    lora = options.get("lora")
    if isinstance(lora, dict):
        problems += lora_problems(lora, list(DEFAULT_LORA))
    elif lora is not None:
        problems.append("lora must be a mapping with r, alpha, dropout, target_modules, got {!r}".format(lora))
    problems += positive_int_problems(
        options, ("batch_size", "gradient_accumulation_steps", "max_length", "max_new_tokens"))
    problems += schedule_problems(options)
    problems += learning_rate_problems(options)
    for key in ("gradient_checkpointing", "merge"):
        if key in options and not isinstance(options[key], bool):
            problems.append("{} must be true or false, got {!r}".format(key, options[key]))
    if options.get("prompt_template") is not None:
        problems += template_problems(options["prompt_template"])
    problems += objective_problems(options)
    problems += seed_problems(options)
    return problems


def check_run_options(options: Optional[Dict[str, Any]]) -> List[str]:
    """:func:`check_options` for all the options a run gives the trainer: also what no run can do without
    (a model), so that the run is refused before it is queued instead of failing once it starts."""
    problems = check_options(options)
    if isinstance(options, dict) and not options.get("model"):
        problems.append(NO_MODEL_MESSAGE)
    return problems


def check_run_schemas(options: Optional[Dict[str, Any]], schemas: List[Tuple[str, str]]) -> List[str]:
    """What the run's ``objective`` cannot train among its ``(schema, kind)`` pairs, before the run is queued."""
    objective = (options or {}).get("objective", DEFAULT_OPTIONS["objective"])
    mismatch = objective_mismatch(objective, schemas, NAME) if objective in (SFT, DPO) else None
    return [mismatch] if mismatch else []


def effective_options(options: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """``options`` over the defaults, ``lora`` a full mapping."""
    merged = dict(DEFAULT_OPTIONS)
    merged.update(options or {})
    merged["lora"] = dict(DEFAULT_LORA, **(merged.get("lora") or {}))
    return merged


# -- training ------------------------------------------------------------------


def train(job: Any, events: Any) -> None:
    """Fine-tune one LoRA adapter per schema of ``job``; write predictions, scores and artifacts.

    ``job`` is a :class:`potato.training.worker.Job`; ``events`` a
    :class:`potato.training.events.EventWriter`. Raises ``Cancelled`` when a
    stop is requested, :class:`OutOfGpuMemory` when CUDA runs out, and
    :class:`TrainerFailure` for problems the user can fix. In a
    data-parallel run every process calls this with its own ``job.group``;
    rank 0 alone writes the run's files and its log lines.
    """
    from potato.training.predictions import PredictionStream, finish_run
    from potato.training.process_group import SingleProcess

    opts = effective_options(job.options)
    if not opts["model"]:
        raise TrainerFailure(NO_MODEL_MESSAGE)
    group = getattr(job, "group", None) or SingleProcess()
    say = events.log if group.is_main else (lambda *args, **kwargs: None)
    schemas = list(answers_of(job.manifest, job.schemas, NAME, TRAINERS[NAME].kinds).values())
    for schema in schemas:
        if schema.kind not in (TEXT, COMPARISON) and not schema.labels:
            raise TrainerFailure("Schema {!r} has no labels to choose from".format(schema.schema))
    mismatch = objective_mismatch(opts["objective"], [(s.schema, s.kind) for s in schemas], NAME)
    if mismatch:
        raise TrainerFailure(mismatch)
    if any(s.kind == TEXT for s in schemas):
        _require_sacrebleu()
    load_from, base_dir = resolve_model(opts["model"])
    if opts["curve"]:
        say("{} draws no learning curve (each share would fine-tune the LLM again); the run trains once".format(NAME),
            level="warning")

    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # progress goes to events.jsonl, not to stderr
    offline = hub_offline()
    dev = ComputeDevice(torch, job.device)
    opts["load_in_4bit"] = _four_bit(opts["load_in_4bit"], dev, say)
    if opts["load_in_4bit"] and not dev.cuda:
        # bitsandbytes computes 4-bit layers on the CPU in fp32 whatever autocast asks, so bf16 autocast
        # only adds casts around them: measured on the bench's tiny Llama, prediction took 5.9 s in bf16
        # autocast and 4.4 s in fp32.
        dev = ComputeDevice(torch, job.device, "fp32")
    config = _read_config(base_dir)
    if dev.cuda:
        _check_gpu_memory(torch, config, opts, schemas, dev, job, group, say)

    try:
        tokenizer = AutoTokenizer.from_pretrained(load_from, local_files_only=offline)
    except (OSError, ValueError) as exc:
        raise TrainerFailure("The tokenizer of {} could not be loaded: {}".format(opts["model"], first_line(exc)))
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        # Padding is masked out everywhere, so any token will do; the end token is there in nearly every tokenizer.
        tokenizer.pad_token = tokenizer.eos_token
        say("The tokenizer has no pad token; padding with its end token {!r}".format(tokenizer.eos_token))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    base = _load_base(load_from, opts, dev, offline)
    try:
        fmt = PromptFormat(tokenizer, _eos_ids(base))
    except ValueError as exc:
        raise TrainerFailure("The tokenizer of {} cannot end an answer: {}".format(opts["model"], exc))

    loop = FineTune(job, events, opts, group)  # what hf_common's training loop reads: options, device, group
    loop.dev = dev
    items = job.index_items()
    scores = {}  # type: Dict[str, Any]
    stream = PredictionStream(job.dir, None if group.size == 1 else group.rank)
    described = False

    def adapter() -> Any:
        """A new LoRA adapter on ``base``; the run log's model line with the first."""
        nonlocal described
        torch.manual_seed(opts["seed"])  # the adapter's initial weights: the same in every process
        model = _with_adapter(base, opts)
        if not described:
            say(_model_line(opts, model, dev, job, len(items)))
            described = True
        return model

    def last_prediction(model: Any, schema: SchemaAnswers) -> None:
        """Before the prediction of the run's last schema: no training follows it, so 4-bit layers may use
        bitsandbytes' CPU inference kernel (a merge needs the weights as they were loaded)."""
        if opts["load_in_4bit"] and schema is schemas[-1] and not opts["merge"]:
            _cpu_inference_kernel(model, True)

    def saved_and_unloaded(model: Any, schema: SchemaAnswers, template: str) -> Any:
        """Save the schema's adapter (rank 0) and say its holdout; the base without the adapter, for the next."""
        if dev.cuda:
            say("Schema {!r}: peak GPU memory {:.1f} GB on {}".format(
                schema.schema, torch.cuda.max_memory_allocated(dev.device) / 1024 ** 3, job.device_name))
        if group.is_main:
            out_dir = os.path.join(job.artifacts_dir, safe_dirname(schema.schema))
            saved = _save(model, tokenizer, out_dir, schema, opts, load_from, template, fmt, offline)
            say("Schema {!r}: holdout {}; {} saved to {}".format(schema.schema, scores[schema.schema], saved, out_dir))
        unloaded = model.unload()
        if dev.cuda:
            torch.cuda.empty_cache()
        return unloaded

    try:
        for schema in schemas:
            template = opts["prompt_template"] or DEFAULT_TEMPLATES[schema.kind]
            if schema.kind == COMPARISON:
                try:
                    model, scores[schema.schema] = _learn_preferences(
                        adapter(), schema, items, fmt, template, pad_id, loop, stream, say, last_prediction)
                except Exception as exc:
                    _raise_if_out_of_memory(torch, exc, job.device_name, "train", opts)
                    raise
                base = saved_and_unloaded(model, schema, template)
                del model
                continue
            answers = AnswerTokens(fmt, schema.kind, schema.labels)
            labelled = gold_answers(items, schema)
            gold, train_idx, holdout_idx = labelled.golds, labelled.train, labelled.holdout
            fit_idx, val_idx = split_validation(train_idx, opts, gold.get if schema.kind == NOMINAL else None)
            prompter = _Prompter(fmt, answers, template, schema, opts)
            examples, cut = prompter.examples((i, items.read(i)[1], gold[i]) for i in fit_idx)
            val_examples, _ = prompter.examples((i, items.read(i)[1], gold[i]) for i in val_idx)
            say("Schema {!r} ({}): {} training items ({} examples), {} held out{}".format(
                schema.schema, schema.kind, len(train_idx), len(examples), len(holdout_idx),
                ", labels " + ", ".join(schema.labels) if schema.labels else ""))
            if cut:
                say("Schema {!r}: {} training texts were cut to fit max_length {}".format(
                    schema.schema, cut, opts["max_length"]), level="warning")

            model = adapter()
            try:
                wrapped = group.wrap(model)
                keep = logits_keyword(wrapped)
                model = train_loop(wrapped, [len(p) + len(a) for p, a in examples],
                                   _batch_loss(examples, pad_id, dev, keep), loop, schema.schema,
                                   opts["gradient_accumulation_steps"],
                                   _validation(val_examples, pad_id, dev, keep, opts["batch_size"]), "answer loss")
            except Exception as exc:
                _raise_if_out_of_memory(torch, exc, job.device_name, "train", opts)
                raise
            model = group.unwrap(model)
            say("Schema {!r}: {}".format(schema.schema, describe_fit(loop, len(examples), len(val_examples))))
            if group.size > 1:
                say("Schema {!r}: trained data-parallel on {} devices ({})".format(
                    schema.schema, group.size, group.backend))

            events.check_cancelled()
            predict_idx = labelled.to_predict(items, job.include_unlabeled)
            is_holdout = set(holdout_idx)
            held = {}  # type: Dict[int, Any]
            mine = shard(sorted(predict_idx, key=lambda i: items.text_lengths[i], reverse=True), group)
            budget, rows = dev.predict_budget, dev.predict_rows
            if dev.cuda:  # scoring holds one copy of a batch's cache per label (yes and no for multiselect)
                copies = 1 + (0 if schema.kind == TEXT else 2 if schema.kind == MULTILABEL else len(answers.choices))
                budget = min(budget, predict_token_budget(config, torch.cuda.mem_get_info(dev.device)[0]) // copies)
            batches = token_budget_batches(mine, lambda i: prompter.estimated_tokens(items.text_lengths[i]),
                                           budget, rows)
            texts = ([(i, items.read(i)) for i in batch] for batch in batches)  # read as they are needed
            last_prediction(model, schema)
            try:
                for i, item_id, record in predict(model, prompter, texts, len(batches), pad_id, dev, events,
                                                  holdout=is_holdout):
                    record = dict({"id": item_id, "schema": schema.schema}, **record)
                    if i in is_holdout:
                        held[i] = record["text"] if schema.kind == TEXT else record["label"]
                    stream.write(record)
            except Exception as exc:
                _raise_if_out_of_memory(torch, exc, job.device_name, "predict", opts)
                raise
            if prompter.cut_predicting:
                say("Schema {!r}: {} texts were cut to fit max_length {} for prediction".format(
                    schema.schema, prompter.cut_predicting, opts["max_length"]), level="warning")
            for part in group.gather(held) if group.size > 1 else []:
                held.update(part)
            scores[schema.schema] = holdout_scores(
                [gold[i] for i in holdout_idx], [held[i] for i in holdout_idx], schema.kind, schema.labels)
            base = saved_and_unloaded(model, schema, template)
            del model
    except BaseException:
        stream.discard()
        raise
    finally:
        items.close()
    finish_run(job, events, stream, group, scores)


def _learn_preferences(model: Any, schema: SchemaAnswers, items: Any, fmt: PromptFormat, template: str,
                       pad_id: int, loop: FineTune, stream: Any, say: Any,
                       before_predicting: Any) -> Tuple[Any, Dict[str, Any]]:
    """Train ``model``'s adapter with DPO on a comparison schema (potato/training/trainers/llm_preference.py),
    write its predictions; returns the tuned model and the schema's holdout scores."""
    from potato.training.trainers.hf_reward_model import prediction

    job, events, opts, dev, group = loop.job, loop.events, loop.opts, loop.dev, loop.group
    beta, batch_size, check = opts["beta"], opts["batch_size"], events.check_cancelled
    labelled = gold_answers(items, schema)
    gold = labelled.golds
    pairs = Pairs(fmt, template, schema, items, opts["max_length"])
    signs = {i: chosen_sign(gold[i]) for i in labelled.train if pairs.has(i)}
    train_idx = [i for i in labelled.train if signs.get(i)]
    holdout_idx = [i for i in labelled.holdout if pairs.has(i)]
    if not train_idx:
        raise TrainerFailure("Schema {!r} has no training comparison with a majority (every one is a tie or lacks "
                             "two responses): DPO has no pair to learn from".format(schema.schema))
    fit_idx, val_idx = split_validation(train_idx, opts)
    say("Schema {!r} (comparison): objective dpo, beta {:g}; {} training pairs with a majority ({} ties or "
        "without two responses left out), {} held out; the reference model is the base, its adapter disabled".format(
            schema.schema, beta, len(train_idx), len(labelled.train) - len(train_idx), len(holdout_idx)))
    keep = logits_keyword(model)
    reference = {i: (a, b) for i, a, b in log_likelihoods(model, pairs, fit_idx + val_idx, pad_id, dev, keep,
                                                          batch_size, True, check)}
    wrapped = group.wrap(model)
    model = group.unwrap(train_loop(
        wrapped, [2 * pairs.length(i) for i in fit_idx], batch_loss(pairs, fit_idx, reference, signs, beta, pad_id,
                                                                    dev, keep),
        loop, schema.schema, opts["gradient_accumulation_steps"],
        validation(pairs, val_idx, reference, signs, beta, pad_id, dev, keep, batch_size), "preference agreement"))
    say("Schema {!r}: {}".format(schema.schema, describe_fit(loop, len(fit_idx), len(val_idx))))
    events.check_cancelled()

    mine = shard([i for i in labelled.to_predict(items, job.include_unlabeled) if pairs.has(i)], group)
    before_predicting(model, schema)
    events.progress("predict", 0, 2, force=True, schema=schema.schema)
    base_logps = {i: (a, b) for i, a, b in log_likelihoods(model, pairs, mine, pad_id, dev, keep, batch_size, True,
                                                           check)}
    events.progress("predict", 1, 2, schema=schema.schema)
    is_holdout = set(holdout_idx)
    held, before = {}, {}  # type: Dict[int, str], Dict[int, str]
    for i, a, b in log_likelihoods(model, pairs, mine, pad_id, dev, keep, batch_size, False, check):
        record = prediction(items.read(i)[0], schema.schema, *rewards((a, b), base_logps[i], beta))
        if i in is_holdout:
            held[i] = record["label"]
            before[i] = SIDES[1] if base_logps[i][1] >= base_logps[i][0] else SIDES[0]
        stream.write(record)
    events.progress("predict", 2, 2, schema=schema.schema)
    if pairs.cut:
        say("Schema {!r}: {} comparisons were cut to fit max_length {}".format(
            schema.schema, pairs.cut, opts["max_length"]), level="warning")
    for part in group.gather((held, before)) if group.size > 1 else []:
        held.update(part[0])
        before.update(part[1])
    golds = [gold[i] for i in holdout_idx]
    scores = holdout_scores(golds, [held[i] for i in holdout_idx], COMPARISON, schema.labels)
    scores["agreement_before"] = holdout_scores(golds, [before[i] for i in holdout_idx], COMPARISON)["agreement"]
    return model, scores


def _require_sacrebleu() -> None:
    import importlib.util

    if importlib.util.find_spec("sacrebleu") is None:
        raise TrainerFailure(
            "Text answers are scored with sacrebleu, which {} cannot import: pip install sacrebleu into it "
            "(the potato-annotation[train-llm] extra has it)".format(sys.executable))


def _four_bit(setting: Any, dev: ComputeDevice, say: Any) -> bool:
    """Whether the base weights load in 4 bits: ``load_in_4bit`` with ``auto`` decided here."""
    if setting is False or (setting == "auto" and not dev.cuda):
        return False
    support = four_bit_support(str(dev.device) if dev.cuda else "cpu")
    if setting == "auto":
        if not support.ok:
            say("load_in_4bit is auto and bitsandbytes cannot load 4-bit weights here ({}); loading 16-bit "
                "weights".format(support.problem), level="warning")
        return support.ok
    if not support.ok:
        raise TrainerFailure(bitsandbytes_missing_message(socket.gethostname(), sys.executable, support.problem))
    return True


def _read_config(base_dir: str) -> Dict[str, Any]:
    try:
        with open(os.path.join(base_dir, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise TrainerFailure("The model at {} has no readable config.json: {}".format(base_dir, first_line(exc)))
    if not isinstance(config, dict):
        raise TrainerFailure("The model at {} has a config.json that is not a JSON object".format(base_dir))
    return config


def _training_estimate(config: Dict[str, Any], opts: Dict[str, Any], four_bit: bool, processes: int,
                       text: bool) -> Any:
    """:func:`estimate_training_memory` for a run with ``opts`` (effective) split over ``processes``;
    ``text``: whether a schema generates text (its answers run to ``max_new_tokens``). Under ``objective:
    dpo`` a batch holds both responses of each pair, each up to half of ``max_length``, all of their logits."""
    dpo = opts.get("objective") == DPO
    return estimate_training_memory(
        config, load_in_4bit=four_bit, batch_size=-(-opts["batch_size"] // processes) * (2 if dpo else 1),
        max_length=opts["max_length"], lora_r=opts["lora"]["r"],
        gradient_checkpointing=opts["gradient_checkpointing"],
        answer_tokens=opts["max_length"] // 2 if dpo else opts["max_new_tokens"] if text else 16)


def gpu_memory_mb(options: Optional[Dict[str, Any]], host: Optional[Dict[str, Any]] = None) -> Optional[int]:
    """The registry's ``gpu_memory_mb`` hook: the MB of GPU memory one process needs to train with
    ``options`` (the estimate a run on CUDA checks before it loads the model), or None where it cannot be
    told: a model whose config.json cannot be read, or one without the usual shape.

    ``host``: the probe's report of the GPU host (potato/training/probe.py), whose ``models`` carry the
    model's config.json as read there; None reads the model's directory on this machine.
    ``load_in_4bit: auto`` counts as 4-bit where bitsandbytes works (or nobody asked), and a schema's
    answers as text (the longest: ``max_new_tokens``), so the figure is what the run may need.
    """
    estimate = _host_estimate(effective_options(options), host)
    return None if isinstance(estimate, str) or estimate is None else int(-(-estimate.total // 2 ** 20))


def _host_estimate(opts: Dict[str, Any], host: Optional[Dict[str, Any]]) -> Any:
    """:func:`_training_estimate` from the model's config.json where it is (``host``'s report, else this
    machine): the estimate, a sentence saying why there is none, or None when there is nothing to say."""
    model = opts["model"]
    if not isinstance(model, str) or not model.strip():
        return None
    if host is None:
        if not os.path.isdir(os.path.expanduser(model)):
            return None
        try:
            config = _read_config(os.path.expanduser(model))  # type: Any
        except TrainerFailure as exc:
            return str(exc)
    else:
        found = (host.get("models") or {}).get(model) or {}
        config = found.get("config")
        if not isinstance(config, dict):
            return found.get("problem")
    try:
        return _training_estimate(config, opts, _four_bit_there(opts, host), 1, True)
    except (ValueError, TypeError) as exc:
        return "its config.json has no usable shape ({})".format(exc)


def _four_bit_there(opts: Dict[str, Any], host: Optional[Dict[str, Any]]) -> bool:
    """Whether a run loads 4-bit weights on ``host``: true, or auto where bitsandbytes works (or nobody asked)."""
    support = (host or {}).get("four_bit") or {"ok": True}
    return opts["load_in_4bit"] is True or (opts["load_in_4bit"] == "auto" and bool(support.get("ok")))


def host_questions(options: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The registry's ``host_questions`` hook: what the host probe looks up for a run with ``options``:
    the model (its config.json, for the estimate) and, unless ``load_in_4bit: false``, whether 4-bit works."""
    opts = effective_options(options)
    questions = {"four_bit": opts["load_in_4bit"] is not False}  # type: Dict[str, Any]
    if isinstance(opts["model"], str) and opts["model"].strip():
        questions["models"] = [opts["model"]]
    return questions


def host_check(options: Optional[Dict[str, Any]], host: Dict[str, Any], name: str) -> HostCheck:
    """The registry's ``host_check`` hook: what the probe's report ``host`` of the GPU host ``name`` says
    of a run with ``options``, before anything is copied there: problems that stop the run (a model
    directory not there, a hub id not in its cache while it is offline, 4-bit asked for where bitsandbytes
    does not work) and lines for the run log and ``potato training check`` (4-bit, the memory estimate)."""
    opts = effective_options(options)
    model, problems, notes = opts["model"], [], []  # type: Any, List[str], List[str]
    found = (host.get("models") or {}).get(model) or {} if model else {}
    if found.get("found") == "no-dir":
        problems.append("model {!r} is not a directory on {}; set model to a model directory there or to a "
                        "Hugging Face hub id".format(model, name))
    elif found.get("found") == "not-cached" and found.get("offline"):
        problems.append(
            "The model {m!r} is not on {h} and Hugging Face Hub downloads are off there (HF_HUB_OFFLINE=1): "
            "download it on a machine with network access (`hf download {m} --local-dir DIR`), copy DIR to "
            "{h} and set model to that directory".format(m=model, h=name))
    elif found.get("found") == "not-cached":
        notes.append("{} is not in the Hugging Face cache on {}: the run downloads it there".format(model, name))
    support = host.get("four_bit")
    if support is not None and "torch" not in (host.get("missing") or ()):  # else the missing torch is said
        if support.get("ok"):
            notes.append("4-bit: bitsandbytes {} loads 4-bit weights on {} ({})".format(
                support.get("version"), name, support.get("device")))
        elif opts["load_in_4bit"] is True:
            problems.append(bitsandbytes_missing_message(name, str(host.get("executable") or "python"),
                                                         str(support.get("problem"))))
        else:
            notes.append("4-bit: bitsandbytes cannot load 4-bit weights on {} ({}); load_in_4bit: auto loads "
                         "16-bit weights there".format(name, support.get("problem")))
    size = _model_size(found.get("config"))
    if size:
        notes.append("{}: {}".format(model, size))
    estimate = _host_estimate(opts, host)
    if isinstance(estimate, str):
        notes.append("No GPU memory estimate for {}: {}".format(model, estimate))
    elif estimate is not None and not problems:
        notes.append("{} needs {} of GPU memory to train {} (batch_size {}, max_length {})".format(
            model, estimate.describe(), "at 4-bit" if _four_bit_there(opts, host) else "in 16-bit",
            opts["batch_size"], opts["max_length"]))
    return HostCheck(problems, notes)


def _parameters(config: Any) -> Optional[int]:
    """The model's parameters (linear layers and embeddings) from its config.json, None where it cannot tell."""
    try:
        return parameter_counts(read_shape(config))["total"] if isinstance(config, dict) else None
    except (ValueError, TypeError, ZeroDivisionError):
        return None


def _model_size(config: Any) -> str:
    """``0.49 B parameters, 0.99 GB in 16 bits`` (``12.3 M`` under a billion): what a model's config.json says
    of its size."""
    params = _parameters(config)
    if not params:
        return ""
    count = "{:.2f} B".format(params / 1e9) if params >= 1e9 else "{:.1f} M".format(params / 1e6)
    return "{} parameters, {:.2f} GB in 16 bits".format(count, params * 2 / 1e9)


# FLOPs per parameter and token: a forward pass is 2; training LoRA adds the backward pass through the frozen
# base (2 more, for the activations' gradients; the base's own weight gradients are never computed).
TRAIN_FLOPS, PREDICT_FLOPS = 4, 2
# Tokens around an item's text: the prompt's own words, the labels it names, the answer.
PROMPT_TOKENS = 48


def rough_time(options: Optional[Dict[str, Any]], host: Dict[str, Any], counts: Dict[str, Any]) -> Optional[str]:
    """The registry's ``rough_time`` hook: about how long a run with ``options`` computes on the host of the
    probe report ``host`` (its ``speed``: the GFLOP/s a matrix product reaches there), for ``counts``:
    ``train`` items per epoch, ``predict`` items predicted, ``chars`` their mean length. A floor, not a
    promise: real steps also wait on memory, and a first run loads the model; None where it cannot be told."""
    opts = effective_options(options)
    found = (host.get("models") or {}).get(opts["model"]) or {}
    params, speed = _parameters(found.get("config")), (host.get("speed") or {}).get("gflops")
    if not params or not speed:
        return None
    tokens = min(opts["max_length"], int(counts.get("chars", 0) / 4) + PROMPT_TOKENS)  # ~4 characters a token
    # The epochs the run's schedule will choose (potato.training.trainers.schedule): early stopping may end it sooner.
    fit, validation = split_validation(range(counts.get("train", 0)), opts)
    plan = make_plan(len(fit), opts["batch_size"], opts["gradient_accumulation_steps"], opts, bool(validation))
    flops = params * tokens * (TRAIN_FLOPS * len(fit) * plan.epochs
                               + PREDICT_FLOPS * (counts.get("predict", 0) + len(validation) * plan.epochs))
    epochs = "{} epoch(s)".format(plan.epochs) + (" (at least {} steps; early stopping may end it sooner)".format(
        opts["min_steps"]) if plan.chosen else "")
    return ("Rough time on {device}: at least {took} to train {train} item(s) for {epochs} and predict "
            "{predict} (about {tokens} tokens each, at the {speed:g} GFLOP/s a matrix product reaches here)").format(
        device=(host.get("speed") or {}).get("device", "this machine"), took=_about(flops / (speed * 1e9)),
        train=counts.get("train", 0), epochs=epochs, predict=counts.get("predict", 0), tokens=tokens,
        speed=speed)


def _about(seconds: float) -> str:
    if seconds < 90:
        return "{:.0f} s".format(max(seconds, 1))
    if seconds < 5400:
        return "{:.0f} min".format(seconds / 60)
    return "{:.1f} h".format(seconds / 3600)


def _check_gpu_memory(torch: Any, config: Dict[str, Any], opts: Dict[str, Any], schemas: List[SchemaAnswers],
                      dev: ComputeDevice, job: Any, group: Any, say: Any) -> None:
    """Refuse, before loading, a run whose estimate is more than the GPU has free."""
    try:
        estimate = _training_estimate(config, opts, opts["load_in_4bit"], group.size,
                                      any(s.kind == TEXT for s in schemas))
    except ValueError as exc:  # a config.json without the usual shape keys: no estimate, no refusal
        say("No GPU memory estimate for {}: {}".format(opts["model"], exc), level="warning")
        return
    free = torch.cuda.mem_get_info(dev.device)[0]
    problem = too_little_memory_message(opts["model"], estimate, free, job.device_name, opts)
    if problem:
        raise TrainerFailure(problem)
    say("GPU memory: the run needs {}; {} has {:.1f} GB free".format(estimate.describe(), job.device_name,
                                                                      free / 1024 ** 3))


def _load_base(load_from: str, opts: Dict[str, Any], dev: ComputeDevice, offline: bool) -> Any:
    """The base model on the device, frozen: 4-bit linear layers with bitsandbytes, or 16/32-bit weights."""
    import torch
    from transformers import AutoModelForCausalLM

    # Frozen weights need no fp32 master copy: 16-bit on a GPU, fp32 on the CPU (which computes in fp32).
    weight_dtype = dev.dtype or torch.float32
    kwargs = {dtype_keyword(): weight_dtype, "local_files_only": offline}  # type: Dict[str, Any]
    if opts["load_in_4bit"]:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=opts["bnb_4bit_quant_type"],
            bnb_4bit_compute_dtype=weight_dtype, bnb_4bit_use_double_quant=True)
        kwargs["device_map"] = {"": dev.device}
    try:
        model = AutoModelForCausalLM.from_pretrained(load_from, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise TrainerFailure("{} could not be loaded as a causal language model: {}".format(
            opts["model"], first_line(exc)))
    if opts["load_in_4bit"]:
        _cpu_inference_kernel(model, False)
    else:
        model.to(dev.device)
    model.requires_grad_(False)
    if opts["gradient_checkpointing"]:
        # Non-reentrant: works with frozen inputs and with DDP.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _cpu_inference_kernel(model: Any, allowed: bool) -> None:
    """Whether bitsandbytes may repack the 4-bit weights for its CPU inference kernel.

    On a CPU with AVX512-BF16, a 4-bit layer's first forward pass in eval mode
    without gradients repacks its weights for a faster kernel, and from then on
    every pass uses that kernel, training ones too: autograd cannot go through
    it, so the gradient stops at each base layer and only the LoRA matrices of
    the last layers learn in earnest (measured on the tests' tiny Llama: the
    first layer's LoRA gradient fell to a tenth). A run makes such a pass
    before training (DPO's reference log-probabilities) and between epochs
    (validation), so the repacking is off from loading and allowed only for
    the prediction no training follows (1.3x the items/s on the bench's tiny
    Llama). Turning it off again cannot undo a repacking; nothing here needs to.
    """
    from bitsandbytes.functional import has_avx512bf16

    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = allowed and has_avx512bf16()


def _eos_ids(model: Any) -> List[int]:
    """The ids that end generation: the generation config's, else the model config's."""
    for config in (getattr(model, "generation_config", None), model.config):
        eos = getattr(config, "eos_token_id", None)
        if eos is not None:
            return [eos] if isinstance(eos, int) else [int(e) for e in eos]
    return []


def _with_adapter(base: Any, opts: Dict[str, Any]) -> Any:
    from peft import LoraConfig, TaskType, get_peft_model

    lora = opts["lora"]
    config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=lora["r"], lora_alpha=lora["alpha"],
                        lora_dropout=lora["dropout"], target_modules=lora["target_modules"])
    return get_peft_model(base, config)


def _model_line(opts: Dict[str, Any], model: Any, dev: ComputeDevice, job: Any, n_items: int) -> str:
    """``Model: <name>, <params> parameters, base weights in 4-bit NF4 (bitsandbytes), LoRA r=8 on <n> modules …``."""
    from peft.tuners.lora import LoraLayer

    trainable, total = model.get_nb_trainable_parameters()
    modules = sum(1 for m in model.modules() if isinstance(m, LoraLayer))
    if opts["load_in_4bit"]:
        weights = "4-bit {} (bitsandbytes)".format(opts["bnb_4bit_quant_type"].upper())
    else:
        weights = "fp32" if dev.dtype is None else "bf16" if dev.dtype == dev.torch.bfloat16 else "fp16"
    return (
        "Model: {}, {} parameters, base weights in {}, LoRA r={} on {} modules ({} trainable), trains in {}, "
        "predicts in {}, on {}; {} items; options: epochs={}, learning_rate={:g}, batch_size={}, "
        "gradient_accumulation_steps={}, max_length={}, max_new_tokens={}, gradient_checkpointing={}, objective={}{}, "
        "seed={}".format(
            opts["model"], _count(total - trainable), weights, opts["lora"]["r"], modules, _count(trainable),
            dev.precision, dev.predict_precision, job.device_name, n_items, opts["epochs"] or "auto", opts["learning_rate"],
            opts["batch_size"], opts["gradient_accumulation_steps"], opts["max_length"], opts["max_new_tokens"],
            str(opts["gradient_checkpointing"]).lower(), opts["objective"],
            " (beta {:g})".format(opts["beta"]) if opts["objective"] == DPO else "", opts["seed"]))


def _count(n: int) -> str:
    """``7.2 B``, ``494.0 M``, ``16.4 K``, ``512``."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return "{:.1f} {}".format(n / size, unit)
    return str(n)


class _Prompter:
    """A schema's prompts and answers as token ids, cut to ``max_length``."""

    def __init__(self, fmt: PromptFormat, answers: AnswerTokens, template: str, schema: SchemaAnswers,
                 opts: Dict[str, Any]):
        self.fmt, self.answers, self.template, self.schema = fmt, answers, template, schema
        self.max_length, self.max_new_tokens = opts["max_length"], opts["max_new_tokens"]
        self.labels = schema.labels if schema.kind != TEXT else []
        self.overhead = len(fmt.prompt(fill(template, "", self.labels, schema.description)))
        self.longest_answer = answers.longest(self.max_new_tokens)
        if self.overhead + self.longest_answer >= self.max_length:
            raise TrainerFailure(
                "max_length {} leaves no room for the item's text in schema {!r}: its prompt takes {} tokens "
                "without the text and its answers up to {}; raise max_length{} or shorten prompt_template".format(
                    self.max_length, schema.schema, self.overhead, self.longest_answer,
                    " or lower max_new_tokens" if schema.kind == TEXT else ""))
        self.cut_predicting = 0

    def prompt(self, text: str, room: int) -> Tuple[List[int], bool]:
        try:
            return self.fmt.fit_prompt(self.template, text, self.labels, self.schema.description, room)
        except PromptTooLong as exc:
            raise self._too_short(exc)

    def _too_short(self, exc: PromptTooLong) -> TrainerFailure:
        # Rare: __init__ checked the room past the prompt's own tokens; a text may still tokenize longer inside it.
        answer = self.max_length - exc.room
        return TrainerFailure(
            "max_length {} is too short for schema {!r}'s prompt: with an item's text cut as far as it goes, "
            "the prompt takes {} tokens where {} are left beside an answer of {}; raise max_length to {} or more{}"
            .format(
                self.max_length, self.schema.schema, exc.tokens, exc.room, answer, exc.tokens + answer,
                " or lower max_new_tokens" if self.schema.kind == TEXT else " or shorten prompt_template"))

    def examples(self, rows: Any) -> Tuple[List[Tuple[List[int], List[int]]], int]:
        """``([(prompt ids, answer ids)], how many texts were cut)`` for ``(position, text, answer)`` rows;
        a text answer's list gives one example per annotator's answer."""
        out, cut = [], 0
        limit = self.max_new_tokens + len(self.fmt.end)
        for _, text, answer in rows:
            for one in (answer if self.schema.kind == TEXT else [answer]):
                target = self.answers.target(one, limit if self.schema.kind == TEXT else None)
                prompt, was_cut = self.prompt(text, self.max_length - len(target))
                cut += was_cut
                out.append((prompt, target))
        return out, cut

    def for_prediction(self, texts: List[str]) -> List[List[int]]:
        """A prediction batch's prompts, tokenized in one call; the few that are too long are cut one by one."""
        room = self.max_length - self.longest_answer
        filled = [fill(self.template, text, self.labels, self.schema.description) for text in texts]
        prompts = []
        for text, ids in zip(texts, self.fmt.prompts(filled)):
            try:
                ids, was_cut = self.fmt.fit_filled(ids, self.template, text, self.labels, self.schema.description,
                                                   room)
            except PromptTooLong as exc:
                raise self._too_short(exc)
            self.cut_predicting += was_cut
            prompts.append(ids)
        return prompts

    def estimated_tokens(self, text_length: int) -> int:
        """A prompt's length from its text's length in characters, for batching by a budget of tokens."""
        return self.overhead + self.longest_answer + estimated_tokens(text_length, self.max_length)


def _batch_loss(examples: List[Tuple[List[int], List[int]]], pad_id: int, dev: ComputeDevice, keep: Optional[str]):
    """hf_common's ``batch_loss``: the cross-entropy of the answer tokens of the examples ``mine`` (their
    prompts are context, never targets), a share of the mean over every answer token of the step; the
    model's logits only where answers are (``keep``: its ``logits_to_keep`` keyword, when it has one)."""
    import torch.nn.functional as F

    def batch_loss(model: Any, mine: List[int], step: List[int], weight: float) -> Any:
        answer_tokens = sum(len(examples[k][1]) for k in step)
        logits, targets, target_mask = answer_logits(model, [examples[k] for k in mine], pad_id, dev, keep)
        return F.cross_entropy(logits[target_mask], targets[target_mask], reduction="sum") * (weight / answer_tokens)

    return batch_loss


def _validation(examples: List[Tuple[List[int], List[int]]], pad_id: int, dev: ComputeDevice, keep: Optional[str],
                batch_size: int) -> Optional[Any]:
    """The training loop's ``validate`` on the validation share's ``examples`` (None without one): the mean
    cross-entropy of their answer tokens, the lower the better (scoring every label, or generating every
    text, after each epoch would cost more than the epoch)."""
    if not examples:
        return None
    loss_of = _batch_loss(examples, pad_id, dev, keep)
    everything = list(range(len(examples)))

    def validate(model: Any) -> Validation:
        loss = sum(float(loss_of(model, everything[k:k + batch_size], everything, 1.0))
                   for k in range(0, len(everything), batch_size))
        return Validation(-loss, loss, loss)

    return validate


def predict(model: Any, prompter: _Prompter, batches: Any, total: int, pad_id: int, dev: ComputeDevice,
            events: Any, holdout: Any = frozenset()):
    """``(position, id, record)`` for each ``(position, (id, text))`` of ``batches``; ``record`` holds the
    kind's prediction fields (docs/answer-types.md): ``label`` and ``confidence`` (``probs`` on ``holdout``
    positions), a multilabel set with each label's probability, or a generated ``text``."""
    import torch

    from potato.training.trainers.llm_decoding import Decoder

    answers, kind = prompter.answers, prompter.schema.kind
    tokenizer = prompter.fmt.tokenizer
    model.eval()
    decoder = Decoder(model, pad_id, dev.put, dev.predict_autocast)
    # Prediction starts now: generating answers can take as long as training, and the run page says which it is.
    events.progress("predict", 0, total, force=True, schema=prompter.schema.schema)
    with torch.inference_mode():
        for step, batch in enumerate(batches, 1):
            events.check_cancelled()
            decoder.start(prompter.for_prediction([text for _, (_, text) in batch]), dev.predict_pad_multiple)
            if kind == TEXT:
                generated = decoder.generate(prompter.max_new_tokens, prompter.fmt.stops, events.check_cancelled)
                records = [{"text": tokenizer.decode(ids, skip_special_tokens=True).strip()} for ids in generated]
            elif kind == MULTILABEL:
                chosen, p_yes = decoder.decide(answers.heads, answers.decisions, events.check_cancelled)
                records = [{
                    "label": [label for label, yes in zip(answers.labels, row) if yes],
                    "confidence": round(min(max(p, 1 - p) for p in probs), 5),
                    "probs": [round(p, 5) for p in probs],
                } for row, probs in zip(chosen, p_yes)]
            else:
                probs = torch.softmax(decoder.score(answers.choices), dim=-1)
                confidence, best = probs.max(dim=-1)
                records = [{"label": answers.labels[b], "confidence": round(c, 5)}
                           for b, c in zip(best.tolist(), confidence.tolist())]
                for (i, _), record, row in zip(batch, records, probs.tolist()):
                    if i in holdout:  # the whole distribution, for calibration and reliability diagrams
                        record["probs"] = [round(p, 5) for p in row]
            for (i, (item_id, _)), record in zip(batch, records):
                yield i, item_id, record
            events.progress("predict", step, total, schema=prompter.schema.schema)
            dev.release()
    model.train()


def _raise_if_out_of_memory(torch: Any, exc: BaseException, device: str, phase: str, opts: Dict[str, Any]) -> None:
    out_of_memory = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(exc, out_of_memory):
        raise OutOfGpuMemory(out_of_gpu_memory_message(device, phase, opts))


def _save(model: Any, tokenizer: Any, out_dir: str, schema: SchemaAnswers, opts: Dict[str, Any], load_from: str,
          template: str, fmt: PromptFormat, offline: bool) -> str:
    """Save the adapter (or, with ``merge``, the merged model), the tokenizer and ``labels.json``;
    returns what was saved, for the log."""
    os.makedirs(out_dir, exist_ok=True)
    for config in model.peft_config.values():
        # A hub id loads on any machine with the model; a directory by its absolute path from any working directory.
        config.base_model_name_or_path = load_from
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    saved = "adapter"
    if opts["merge"]:
        _merge(out_dir, load_from, offline)
        saved = "merged model"
    info = {
        "trainer": NAME,
        "schema": schema.schema,
        "answer_kind": schema.kind,
        "labels": schema.labels,
        "kind": "merged" if opts["merge"] else "lora",
        "base_model": load_from,
        "load_in_4bit": opts["load_in_4bit"],
        "max_length": opts["max_length"],
        "max_new_tokens": opts["max_new_tokens"],
        "prompt_template": template,
        "objective": opts["objective"],
        "description": schema.description,
        "chat_template": fmt.chat,
    }
    with open(os.path.join(out_dir, "labels.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    return saved


def _merge(out_dir: str, load_from: str, offline: bool) -> None:
    """Replace the adapter in ``out_dir`` by the base model with the adapter merged in.

    The base is loaded again at its own precision on the CPU (merging into
    4-bit weights would round the sum back to 4 bits), so this needs the
    model's size in RAM for a moment.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(load_from, local_files_only=offline, **{dtype_keyword(): "auto"})
    merged = PeftModel.from_pretrained(base, out_dir).merge_and_unload()
    for name in ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"):
        path = os.path.join(out_dir, name)
        if os.path.exists(path):
            os.remove(path)
    merged.save_pretrained(out_dir)



