"""hf-llm-finetune's pure parts: its options, its prompts, the GPU memory estimate and every message it words."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from potato.training.trainers import hf_llm_finetune as llm
from potato.training.trainers.llm_memory import (
    GB,
    bitsandbytes_missing_message,
    estimate_training_memory,
    four_bit_support,
    out_of_gpu_memory_message,
    parameter_counts,
    predict_token_budget,
    read_shape,
    too_little_memory_message,
)
from potato.training.trainers.answers import SchemaAnswers
from potato.training.trainers.llm_prompts import AnswerTokens, PromptFormat, PromptTooLong, fill, template_problems
from potato.training.trainers.metrics import describe, holdout_scores

# config.json of Meta-Llama-3-8B and of GPT-2, as the hub ships them (the keys the estimate reads).
LLAMA3_8B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "tie_word_embeddings": False}
GPT2 = {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None}
OPTIONS = {"batch_size": 8, "max_length": 512, "gradient_checkpointing": False, "load_in_4bit": True,
           "max_new_tokens": 64}


# -- options -------------------------------------------------------------------


def test_the_defaults_pass_and_each_bad_value_is_named():
    assert llm.check_options({}) == [] and llm.check_options(None) == []
    assert llm.check_options({"model": "Qwen/Qwen2.5-7B-Instruct", "load_in_4bit": "auto", "lora": {"r": 16},
                              "prompt_template": "{description}\n{text}\nOne of: {labels}"}) == []
    assert llm.check_options({
        "load_in_4bit": "yes", "bnb_4bit_quant_type": "int4", "lora": {"rank": 8, "dropout": 1.5},
        "gradient_accumulation_steps": 0, "max_new_tokens": True, "merge": "true", "learning_rate": float("nan"),
        "prompt_template": "Review: {txt}", "pyhton": 1,
    }) == [
        "'pyhton' is not an option of hf-llm-finetune; valid options: batch_size, beta, bnb_4bit_quant_type, curve, epochs, "
        "gradient_accumulation_steps, gradient_checkpointing, learning_rate, load_in_4bit, lora, max_length, "
        "max_new_tokens, merge, min_steps, model, objective, patience, prompt_template, seed, validation_share, warmup",
        "load_in_4bit must be true, false or auto, got 'yes'",
        "bnb_4bit_quant_type must be nf4 or fp4, got 'int4'",
        "lora.rank is not a LoRA option; valid: r, alpha, dropout, target_modules",
        "lora.dropout must be a number from 0 to below 1, got 1.5",
        "gradient_accumulation_steps must be a positive integer, got 0",
        "max_new_tokens must be a positive integer, got True",
        "learning_rate must be a positive number, got nan",
        "merge must be true or false, got 'true'",
        "prompt_template has {txt}, which is not a placeholder; the placeholders are {text}, {labels}, {description}",
        "prompt_template must contain {text}, where the item's text goes",
    ]
    assert llm.check_options({"lora": True}) == [
        "lora must be a mapping with r, alpha, dropout, target_modules, got True"]


def test_potato_validate_refuses_a_bad_option_naming_the_key(tmp_path):
    from potato.config import load_config
    from potato.errors import ConfigError
    from tests.support.potato_project import make_project

    config = make_project(tmp_path, model_training={
        "enabled": True, "trainers": {"hf-llm-finetune": {"model": "/models/qwen", "max_new_tokens": 0}}})
    with pytest.raises(ConfigError) as raised:
        load_config(config)
    assert "model_training.trainers.hf-llm-finetune: max_new_tokens must be a positive integer, got 0" in str(
        raised.value)


def test_prompt_templates_fill_only_their_placeholders():
    template = '{description}\n\nReview: {text}\nOne of {labels}. JSON: {"a": 1}'
    assert fill(template, "Great.", ["pos", "neg"], "Is it positive?") == \
        'Is it positive?\n\nReview: Great.\nOne of pos, neg. JSON: {"a": 1}'
    assert fill(template, "Great.", ["pos", "neg"], "") == 'Review: Great.\nOne of pos, neg. JSON: {"a": 1}'
    assert template_problems(template) == []
    assert template_problems("") == ["prompt_template must be a non-empty string with {text} in it, got ''"]


class _Characters:
    """A tokenizer of one id per character (no chat template; end of sequence 0): lengths a test can count."""

    eos_token_id = 0
    chat_template = None

    def __call__(self, texts, add_special_tokens=True):
        one = isinstance(texts, str)
        ids = [[ord(c) for c in text] for text in ([texts] if one else texts)]
        return {"input_ids": ids[0] if one else ids}

    def decode(self, ids):
        return "".join(map(chr, ids))


def test_a_prompt_too_long_for_max_length_says_its_tokens_the_room_and_the_length_that_would_do():
    fmt = PromptFormat(_Characters())
    with pytest.raises(PromptTooLong) as raised:
        fmt.fit_prompt("Review: {text}\nLabel:", "a fine film", [], "", room=10)
    assert (raised.value.tokens, raised.value.room) == (len("Review: \nLabel:\n"), 10)  # the text cut to nothing
    schema = SchemaAnswers("sentiment", ["good", "bad"], {"kind": "nominal"})
    prompter = llm._Prompter(fmt, AnswerTokens(fmt, "nominal", ["good", "bad"]), "{text}", schema,
                             {"max_length": 16, "max_new_tokens": 8})
    assert str(prompter._too_short(raised.value)) == (
        "max_length 16 is too short for schema 'sentiment''s prompt: with an item's text cut as far as it goes, "
        "the prompt takes 16 tokens where 10 are left beside an answer of 6; raise max_length to 22 or more or "
        "shorten prompt_template")


def test_the_bundle_decides_each_schemas_kind_and_refuses_the_others():
    from potato.training.trainers.answers import answers_of
    from potato.training.trainers.registry import TRAINERS

    manifest = {"schemas": {"s": ["a", "b"], "t": [], "m": ["x", "y"], "n": []},
                "answers": {"t": {"type": "text", "kind": "text", "description": "Summarize."},
                            "m": {"type": "multiselect", "kind": "multilabel"},
                            "n": {"type": "slider", "kind": "continuous"}}}
    kinds = TRAINERS[llm.NAME].kinds
    schemas = list(answers_of(manifest, ["s", "t", "m"], llm.NAME, kinds).values())
    assert [(s.schema, s.kind, s.labels, s.description) for s in schemas] == [
        ("s", "nominal", ["a", "b"], ""), ("t", "text", [], "Summarize."), ("m", "multilabel", ["x", "y"], "")]
    with pytest.raises(llm.TrainerFailure) as raised:
        answers_of(manifest, ["n"], llm.NAME, kinds)
    assert str(raised.value) == ("Schema 'n' has continuous answers, which hf-llm-finetune cannot train; it trains "
                                 "nominal, ordinal, multilabel, text and comparison schemas")
    assert schemas[0].gold("c") is None and schemas[0].gold("a") == "a"
    assert schemas[1].gold(["  one ", "", 3]) == ["one"]
    assert schemas[2].gold(["y", "x"]) == ("x", "y") and schemas[2].gold([]) == ()
    assert schemas[2].gold(["y", "z"]) is None  # a label the schema does not have: no usable answer


# -- memory ----------------------------------------------------------------------


def test_parameters_from_config_json():
    assert parameter_counts(read_shape(LLAMA3_8B))["total"] == 8_029_995_008  # Llama-3-8B: 8.03 B
    assert parameter_counts(read_shape(GPT2))["total"] == 123_532_032  # GPT-2: 124 M less biases and norms
    with pytest.raises(ValueError) as raised:
        read_shape({"model_type": "mystery", "vocab_size": 10})
    assert str(raised.value) == "config.json has none of hidden_size, n_embd, d_model"


def test_the_gpu_memory_estimate_of_llama3_8b():
    one = estimate_training_memory(LLAMA3_8B, load_in_4bit=True, batch_size=1, max_length=512, lora_r=16)
    assert one.describe() == "about 11.4 GB (weights 5.3, activations 3.7, LoRA 0.6, logits 0.0, CUDA 0.8)"
    checkpointed = estimate_training_memory(LLAMA3_8B, load_in_4bit=True, batch_size=1, max_length=512, lora_r=16,
                                            gradient_checkpointing=True)
    assert round(checkpointed.total / GB, 1) == 7.6
    sixteen_bit = estimate_training_memory(LLAMA3_8B, load_in_4bit=False, batch_size=1, max_length=512, lora_r=16)
    assert round(sixteen_bit.weights / GB, 1) == 15.0 and sixteen_bit.activations == one.activations
    assert estimate_training_memory(LLAMA3_8B, load_in_4bit=True, batch_size=8, max_length=512).total > 24 * GB
    assert predict_token_budget(LLAMA3_8B, 10 * GB) == 21487
    assert predict_token_budget(GPT2, 70 * GB) == 65536 and predict_token_budget(LLAMA3_8B, 0) == 1024


def test_the_registrys_gpu_memory_hook_is_the_training_estimate(tmp_path):
    from potato.training.trainers.registry import TRAINERS, hook

    gpu_memory_mb = hook(TRAINERS[llm.NAME], "gpu_memory_mb")
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    options = {"model": str(tmp_path), "batch_size": 1, "max_length": 512, "lora": {"r": 16}, "max_new_tokens": 16}
    expected = estimate_training_memory(LLAMA3_8B, load_in_4bit=True, batch_size=1, max_length=512, lora_r=16)
    assert gpu_memory_mb(options) == -(-expected.total // 2 ** 20)  # auto counts as 4-bit: what a GPU gets
    assert gpu_memory_mb(dict(options, load_in_4bit=False)) > gpu_memory_mb(options)
    # DPO: both responses of each pair in a batch, each up to half of max_length, every logit of them kept.
    dpo = estimate_training_memory(LLAMA3_8B, load_in_4bit=True, batch_size=2, max_length=512, lora_r=16,
                                   answer_tokens=256)
    assert gpu_memory_mb(dict(options, objective="dpo")) == -(-dpo.total // 2 ** 20) > gpu_memory_mb(options)
    # Nothing to estimate from on this machine: no number rather than a guess.
    assert gpu_memory_mb({"model": "meta-llama/Meta-Llama-3-8B"}) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mystery", "vocab_size": 10}))
    assert gpu_memory_mb(options) is None


def test_too_little_gpu_memory_is_said_with_the_fixes_that_would_help():
    estimate = estimate_training_memory(LLAMA3_8B, load_in_4bit=True, batch_size=8, max_length=512)
    device = "CUDA 0: NVIDIA GeForce RTX 3090 (24 GB)"
    assert too_little_memory_message("meta-llama/Meta-Llama-3-8B", estimate, 40 * GB, device, OPTIONS) is None
    assert too_little_memory_message("meta-llama/Meta-Llama-3-8B", estimate, 6.2 * GB, device, OPTIONS) == (
        "meta-llama/Meta-Llama-3-8B needs about 39.6 GB (weights 5.3, activations 29.5, LoRA 0.3, logits 0.2, "
        "CUDA 0.8) of GPU memory to train with these options, but CUDA 0: NVIDIA GeForce RTX 3090 (24 GB) has 6.2 GB "
        "free. Fix: lower batch_size (8) or max_length (512), set gradient_checkpointing: true, or use a GPU with "
        "more free memory")
    sixteen = dict(OPTIONS, load_in_4bit=False, gradient_checkpointing=True)
    assert too_little_memory_message("m", estimate, 1 * GB, "cuda:0", sixteen).endswith(
        "Fix: lower batch_size (8) or max_length (512), set load_in_4bit: true, or use a GPU with more free memory")


def test_cuda_out_of_memory_is_worded_with_the_fix():
    device = "CUDA 0: NVIDIA L4 (22 GB)"
    assert out_of_gpu_memory_message(device, "train", OPTIONS) == (
        "CUDA 0: NVIDIA L4 (22 GB) ran out of memory while training. Fix: lower batch_size (8) or max_length (512) "
        "(raise gradient_accumulation_steps to keep the batch the optimizer sees), or set gradient_checkpointing: true")
    assert out_of_gpu_memory_message(device, "train", dict(OPTIONS, batch_size=1, gradient_checkpointing=True)) == (
        "CUDA 0: NVIDIA L4 (22 GB) ran out of memory while training. Fix: lower batch_size (1) or max_length (512)")
    assert out_of_gpu_memory_message(device, "predict", dict(OPTIONS, load_in_4bit=False)) == (
        "CUDA 0: NVIDIA L4 (22 GB) ran out of memory while predicting. Fix: lower max_length (512) or "
        "max_new_tokens (64), or set load_in_4bit: true")


def test_out_of_memory_becomes_the_failure_the_worker_exits_5_with(tmp_path):
    torch = pytest.importorskip("torch")
    from potato.training.events import EventWriter, OutOfGpuMemory
    from potato.training.worker import EXIT_GPU_MEMORY, _guarded

    with pytest.raises(OutOfGpuMemory) as raised:
        llm._raise_if_out_of_memory(torch, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"),
                                    "CUDA 0: NVIDIA L4 (22 GB)", "train", OPTIONS)
    llm._raise_if_out_of_memory(torch, ValueError("other"), "cuda:0", "train", OPTIONS)  # not ours: re-raised by caller
    events = EventWriter(str(tmp_path / "events.jsonl"))

    def body():
        raise raised.value

    assert _guarded(str(tmp_path), events, body) == EXIT_GPU_MEMORY == 5
    assert (tmp_path / "exit_code").read_text() == "5\n"
    done = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()][-1]
    assert done["status"] == "failed" and done["error"] == out_of_gpu_memory_message(
        "CUDA 0: NVIDIA L4 (22 GB)", "train", OPTIONS)


# -- 4-bit here? ---------------------------------------------------------------------


def test_four_bit_works_on_this_cpu_and_not_without_bitsandbytes():
    pytest.importorskip("bitsandbytes")
    here = four_bit_support("cpu")
    assert here.ok and here.problem is None and here.version.startswith("0.")
    blocked = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['bitsandbytes'] = None\n"
         "from potato.training.trainers.llm_memory import four_bit_support\nprint(tuple(four_bit_support('cpu')))"],
        capture_output=True, text=True, timeout=120)
    assert blocked.stdout.strip() == (
        "(False, None, 'ModuleNotFoundError: import of bitsandbytes halted; None in sys.modules')"), blocked.stderr


def test_bitsandbytes_missing_is_said_with_the_host_and_the_fix():
    assert bitsandbytes_missing_message("gpu.example.org", "/opt/conda/bin/python3",
                                        "ModuleNotFoundError: No module named 'bitsandbytes'") == (
        '4-bit base weights need bitsandbytes on gpu.example.org, but /opt/conda/bin/python3 there cannot use it '
        '(ModuleNotFoundError: No module named \'bitsandbytes\'). Fix: add "bitsandbytes" to the backend\'s packages '
        '(or pip install it into that interpreter), or set load_in_4bit: false')


# -- text answers' scores -------------------------------------------------------------


def test_text_answers_score_exact_match_against_any_answer_and_chrf():
    pytest.importorskip("sacrebleu")
    gold = [["a happy customer", "a glad customer"], ["an unhappy customer"], ["a happy customer"]]
    predicted = ["a  glad customer", "an unhappy customer", "an unhappy customer"]
    scores = holdout_scores(gold, predicted, "text")
    assert scores["exact_match"] == round(2 / 3, 4) and scores["kind"] == "text" and scores["n"] == 3
    assert 80 < scores["chrf"] < 100
    assert holdout_scores([], [], "text") == {"exact_match": None, "chrf": None, "kind": "text", "n": 0}
    assert describe("summary", {"kind": "text", "exact_match": 0.5, "chrf": 61.25, "n": 20}) == \
        "Holdout summary: exact match 0.500, chrF 61.250 (n=20)"
