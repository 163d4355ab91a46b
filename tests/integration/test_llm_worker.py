"""hf-llm-finetune in the real worker (``python -m potato.training.worker``), offline, on tiny causal LMs.

The learning test proves the scoring, the loss mask and the label mapping
right: a tiny random Llama with 4-bit NF4 base weights cannot reach 0.9 on
held-out reviews unless the loss falls on the answer, the answers map to the
schema's labels and every label is scored. Jobs run with one thread: on a
loaded two-core machine two threads spend most of a tiny model's step
waiting for each other.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from potato.training.trainers import hf_llm_finetune as llm  # noqa: E402
from tests.integration.test_worker import (  # noqa: E402
    done_of,
    events_of,
    run_worker,
    stop_mid_training,
    worker_env,
)
from tests.support.bundles import easy_items, write_job  # noqa: E402
from tests.support.llm_tasks import CUSTOMER, TOPICS, customer_and_topic_items  # noqa: E402

pytestmark = pytest.mark.training

# Tuned before runs warmed up (warmup: 0 keeps that schedule): this test is about 4-bit training, not the defaults.
KEYWORD_TASK = {"load_in_4bit": True, "epochs": 8, "learning_rate": 1e-2, "warmup": 0, "batch_size": 8, "max_length": 96}


def llm_job(path: Path, model: str, items: list, **fields) -> Path:
    options = dict(KEYWORD_TASK, model=model)
    options.update(fields.pop("options", {}))
    fields.setdefault("num_threads", 1)
    return write_job(path, items=items, trainer="hf-llm-finetune", options=options, **fields)


def predictions_of(job: Path) -> list:
    return [json.loads(line) for line in (job / "predictions.jsonl").read_text().splitlines()]


def logs_of(job: Path, level: str | None = None) -> list:
    return [e["message"] for e in events_of(job) if e["type"] == "log" and (level is None or e["level"] == level)]


def test_learns_a_keyword_task_in_4_bit_and_saves_the_adapter(tmp_path, tiny_llama, monkeypatch):
    items = easy_items(200, unlabeled=10)
    job = llm_job(tmp_path / "job", tiny_llama, items)
    result = run_worker(job, timeout=180)
    assert result.returncode == 0, result.stderr

    scores = json.loads((job / "scores.json").read_text())
    assert scores["sentiment"]["n"] == 40
    assert scores["sentiment"]["accuracy"] >= 0.9, scores
    from transformers import AutoModelForCausalLM

    params = AutoModelForCausalLM.from_pretrained(tiny_llama).num_parameters()
    model_line = next(m for m in logs_of(job) if m.startswith("Model: "))
    assert model_line.startswith("Model: {}, {:.1f} K parameters, base weights in 4-bit NF4 (bitsandbytes), "
                                 "LoRA r=8 on 14 modules (16.4 K trainable), trains in full precision (fp32), "
                                 "predicts in ".format(tiny_llama, params / 1000))
    assert "epochs=8, learning_rate=0.01, batch_size=8, gradient_accumulation_steps=1, max_length=96" in model_line
    assert not logs_of(job, "warning")

    predictions = predictions_of(job)
    assert sorted(p["id"] for p in predictions) == sorted(it["id"] for it in items)
    assert all(p["schema"] == "sentiment" and p["label"] in ("positive", "negative") for p in predictions)
    assert all(0.5 <= p["confidence"] <= 1.0 for p in predictions)
    holdout = {it["id"] for it in items if it["holdout"]}
    assert {p["id"] for p in predictions if "probs" in p} == holdout
    for p in predictions:
        if "probs" in p:
            assert abs(sum(p["probs"]) - 1) < 1e-4 and p["confidence"] == max(p["probs"])
            assert p["label"] == ("positive", "negative")[p["probs"].index(p["confidence"])]
    unlabelled = [p for p in predictions if p["id"].startswith("u")]
    assert sum(p["label"] == ("positive", "negative")[int(p["id"][1:]) % 2] for p in unlabelled) >= 8

    saved = job / "artifacts" / "sentiment"
    adapter = json.loads((saved / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == tiny_llama and adapter["r"] == 8
    assert (saved / "adapter_model.safetensors").exists() and not (saved / "model.safetensors").exists()
    info = json.loads((saved / "labels.json").read_text())
    assert info == {**info, "trainer": "hf-llm-finetune", "answer_kind": "nominal", "labels": ["positive", "negative"],
                    "kind": "lora", "base_model": tiny_llama, "load_in_4bit": True, "chat_template": True}
    from peft import AutoPeftModelForCausalLM

    monkeypatch.chdir(tmp_path)
    assert AutoPeftModelForCausalLM.from_pretrained(saved).peft_config["default"].r == 8


def test_text_and_multiselect_answers_on_a_model_without_pad_token_or_chat_template(tmp_path, tiny_gpt2):
    """GPT-2's tokenizer has neither: padding falls back to its end token, prompts to the plain format."""
    items = customer_and_topic_items(100, unlabeled=4)
    job = llm_job(tmp_path / "job", tiny_gpt2, items, schemas=["customer", "topics"],
                  labels={"customer": [], "topics": list(TOPICS)},
                  answers={"customer": {"type": "text", "kind": "text", "description": "Describe the customer."},
                           "topics": {"type": "multiselect", "kind": "multilabel"}},
                  options={"max_length": 128, "max_new_tokens": 6})
    result = run_worker(job, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "The tokenizer has no pad token; padding with its end token '<|endoftext|>'" in logs_of(job)

    scores = json.loads((job / "scores.json").read_text())
    assert scores["customer"]["kind"] == "text" and scores["customer"]["n"] == 20
    assert 0 <= scores["customer"]["exact_match"] <= 1 and 0 <= scores["customer"]["chrf"] <= 100, scores
    assert scores["topics"]["kind"] == "multilabel" and scores["topics"]["n"] == 20

    predictions = predictions_of(job)
    text = [p for p in predictions if p["schema"] == "customer"]
    assert {p["id"] for p in text} >= {"u0", "u1", "u2", "u3"}  # unlabelled items get generated answers
    assert all(set(p) == {"id", "schema", "text"} for p in text)
    # The answers' form is learned (and generation stops at its end) long before which one goes where.
    assert sum(p["text"] in CUSTOMER.values() for p in text) >= 0.9 * len(text), text
    topics = [p for p in predictions if p["schema"] == "topics"]
    assert topics and all(set(p["label"]) <= set(TOPICS) and len(p["probs"]) == 3 for p in topics)
    for p in topics:
        assert p["label"] == [t for t, q in zip(TOPICS, p["probs"]) if q >= 0.5]
        assert abs(p["confidence"] - min(max(q, 1 - q) for q in p["probs"])) < 2e-5
    assert json.loads((job / "artifacts" / "topics" / "labels.json").read_text())["chat_template"] is False


def test_sigterm_stops_training_cancelled_143_no_children(tmp_path, tiny_llama):
    job = llm_job(tmp_path / "job", tiny_llama, easy_items(60, unlabeled=0), options={"epochs": 500})
    stop_mid_training(job)


def test_load_in_4bit_without_bitsandbytes_names_the_host_and_the_fix(tmp_path, tiny_llama):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "bitsandbytes.py").write_text(
        'raise ModuleNotFoundError("No module named \'bitsandbytes\'", name="bitsandbytes")\n')
    job = llm_job(tmp_path / "job", tiny_llama, easy_items(20))
    result = run_worker(job, env=worker_env(extra_path=hide), timeout=90)
    assert result.returncode == 1, result.stderr
    assert done_of(job)["error"] == (
        '4-bit base weights need bitsandbytes on {}, but {} there cannot use it (ModuleNotFoundError: No module '
        'named \'bitsandbytes\'). Fix: add "bitsandbytes" to the backend\'s packages (or pip install it into that '
        'interpreter), or set load_in_4bit: false'.format(socket.gethostname(), sys.executable))


def failure_of(job_dir: Path) -> str:
    """The user's message of the failure ``train`` raises, in this process (as the worker would report it)."""
    from potato.training.events import EventWriter, TrainerFailure
    from potato.training.worker import read_job

    with pytest.raises(TrainerFailure) as raised:
        llm.train(read_job(str(job_dir)), EventWriter(str(job_dir / "events.jsonl")))
    return str(raised.value)


def test_no_model_and_a_model_directory_without_weights(tmp_path, tiny_llama):
    no_model = write_job(tmp_path / "none", items=easy_items(10), trainer="hf-llm-finetune")
    assert failure_of(no_model) == llm.NO_MODEL_MESSAGE == (
        "hf-llm-finetune has no model: set model_training.trainers.hf-llm-finetune.model in the config (or, for one "
        "run, --option model=…) to a local model directory or a Hugging Face hub id (no model ships with Potato; "
        "docs/trainers/hf-llm-finetune.md names some)")

    half = tmp_path / "half-copied"
    half.mkdir()
    for name in os.listdir(tiny_llama):
        if not name.endswith(".safetensors"):
            (half / name).write_bytes(Path(tiny_llama, name).read_bytes())
    broken = write_job(tmp_path / "broken", items=easy_items(10), trainer="hf-llm-finetune",
                       options={"model": str(half), "load_in_4bit": False})
    assert failure_of(broken).startswith("{} could not be loaded as a causal language model: OSError: ".format(half))


def test_a_max_length_with_no_room_for_the_text_says_so(tmp_path, tiny_llama):
    job = llm_job(tmp_path / "job", tiny_llama, easy_items(10), options={"max_length": 20})
    error = failure_of(job)
    assert error.startswith("max_length 20 leaves no room for the item's text in schema 'sentiment': its prompt takes ")
    assert " tokens without the text and its answers up to " in error
    assert error.endswith("; raise max_length or shorten prompt_template")


def test_a_hub_id_that_is_not_here_fails_at_once_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    job = write_job(tmp_path / "job", items=easy_items(10), trainer="hf-llm-finetune",
                    options={"model": "Qwen/Qwen2.5-0.5B-Instruct"})
    started = time.monotonic()
    assert failure_of(job) == (
        "The model 'Qwen/Qwen2.5-0.5B-Instruct' is not on this machine and Hugging Face Hub downloads are off "
        "(HF_HUB_OFFLINE=1): download it on a machine with network access (`hf download Qwen/Qwen2.5-0.5B-Instruct "
        "--local-dir DIR`), copy DIR here and set model to that directory")
    assert time.monotonic() - started < 10


def test_merge_saves_a_merged_model_and_auto_is_16_bit_on_the_cpu(tmp_path, tiny_llama):
    job = llm_job(tmp_path / "job", tiny_llama, easy_items(24, unlabeled=0),
                  options={"load_in_4bit": "auto", "merge": True, "epochs": 1})
    result = run_worker(job, timeout=120)
    assert result.returncode == 0, result.stderr
    assert ", base weights in fp32, LoRA r=8 on 14 modules" in next(m for m in logs_of(job) if m.startswith("Model: "))
    saved = job / "artifacts" / "sentiment"
    assert (saved / "model.safetensors").exists() and not (saved / "adapter_config.json").exists()
    assert json.loads((saved / "labels.json").read_text())["kind"] == "merged"
    assert "Schema 'sentiment': holdout " in "\n".join(logs_of(job))
    assert any(m.endswith("merged model saved to {}".format(saved)) for m in logs_of(job))
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(saved).config.model_type == "llama"


def _first_layer_lora_gradient(model, ids, eval_pass_first: bool) -> float:
    import torch

    if eval_pass_first:  # as DPO's reference pass before training, or a validation between epochs
        model.eval()
        with torch.inference_mode():
            model(input_ids=ids)
    model.train()
    model.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    return next(p.grad.norm().item() for n, p in model.named_parameters()
                if "layers.0.self_attn.q_proj.lora_A" in n)


def test_a_4_bit_base_passes_the_gradient_through_after_an_eval_pass(tiny_llama):
    """bitsandbytes repacks a 4-bit layer for its CPU inference kernel at its first eval pass on a CPU with
    AVX512-BF16, and that kernel has no backward: the gradient would stop at every base layer from then on.
    Off from loading, so an eval pass before training or between epochs leaves training as it was."""
    import torch
    from bitsandbytes.functional import has_avx512bf16

    if not has_avx512bf16():
        pytest.skip("bitsandbytes repacks 4-bit weights only on a CPU with AVX512-BF16; this one has none")
    opts = llm.effective_options({"model": tiny_llama, "load_in_4bit": True})
    opts["lora"] = dict(opts["lora"], dropout=0.0)  # the two passes must compute the same
    grads = []
    for eval_pass_first in (False, True):
        base = llm._load_base(tiny_llama, opts, llm.ComputeDevice(torch, "cpu"), True)
        torch.manual_seed(0)
        model = llm._with_adapter(base, opts)
        for name, param in model.named_parameters():
            if "lora_B" in name:  # a new adapter's B is zero, which would stop A's gradient by itself
                param.data.normal_(0, 0.1)
        grads.append(_first_layer_lora_gradient(model, torch.tensor([[3, 5, 7, 9, 11, 13]]), eval_pass_first))
    assert grads[1] == pytest.approx(grads[0], rel=1e-4), grads
    # The last schema's prediction, which no training follows, may use the faster kernel.
    llm._cpu_inference_kernel(model, True)
    _first_layer_lora_gradient(model, torch.tensor([[3, 5, 7]]), eval_pass_first=True)
    assert all(m.weight.quant_state.packing_format_for_cpu for m in model.modules()
               if hasattr(m, "support_avx512bf16_for_cpu"))


@pytest.mark.slow  # a minute on a loaded 2-core machine, most of it two processes importing torch
def test_two_cpu_processes_train_data_parallel(tmp_path, tiny_llama):
    items = easy_items(24, unlabeled=4)
    job = llm_job(tmp_path / "job", tiny_llama, items, processes=2, num_threads=2, options={"epochs": 1})
    result = run_worker(job, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "Training data-parallel on 2 devices (gloo): CPU (1 thread), CPU (1 thread)" in logs_of(job)
    assert sorted(p["id"] for p in predictions_of(job)) == sorted(it["id"] for it in items)
    assert json.loads((job / "scores.json").read_text())["sentiment"]["n"] == 6
    assert (job / "artifacts" / "sentiment" / "adapter_model.safetensors").exists()


def test_generation_stops_at_a_cancel_between_tokens():
    """Cancel reaches a text schema's generation between two tokens, not after the batch."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from potato.training.events import Cancelled
    from potato.training.trainers.llm_decoding import Decoder

    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    asked = []

    def check():
        asked.append(1)
        if len(asked) == 3:
            raise Cancelled("Cancelled")

    decoder = Decoder(model, 0, lambda t: t, torch.no_grad)
    decoder.start([[1, 2, 3], [4, 5]])
    with pytest.raises(Cancelled):
        decoder.generate(40, frozenset(), check)
    assert len(asked) == 3


def test_texts_and_ids_json_can_carry_but_utf8_cannot_are_trained_and_predicted(tmp_path, tiny_llama, monkeypatch):
    """A lone surrogate or a NUL in an item's text or id (a data file is not ours to trust) neither stops the
    tokenizer nor the predictions file; the id comes back as it went in."""
    from potato.training.events import EventWriter
    from potato.training.worker import read_job

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    items = easy_items(12, unlabeled=2)
    items[0]["text"] += " \ud83d and \x00"
    items[-1]["id"] = "odd \udc80 id"
    items[-1]["text"] = "\ud800" * 3
    job = llm_job(tmp_path / "job", tiny_llama, items, options={"epochs": 1})
    llm.train(read_job(str(job)), EventWriter(str(job / "events.jsonl")))
    predictions = predictions_of(job)
    assert sorted(p["id"] for p in predictions) == sorted(it["id"] for it in items)
