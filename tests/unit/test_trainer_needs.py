"""What a run's trainers make of the ssh probe's answers (potato/backends/ssh/trainer_needs.py): pure input →
the problems, notes and GPU memory a run is given, whatever shape a host's answers come in."""

from __future__ import annotations

import pytest

from potato.backends.ssh.trainer_needs import MAX_SAID, assess, probe_questions
from potato.training.trainers.hf_llm_finetune import NAME

LLAMA_8B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8}
OPTIONS = {NAME: {"model": "/models/llama-3-8b", "load_in_4bit": True}}


def test_the_llm_trainer_asks_for_its_model_and_4_bit_unless_the_run_cannot_judge_it():
    assert probe_questions(OPTIONS) == {"models": ["/models/llama-3-8b"], "four_bit": True}
    assert probe_questions(OPTIONS, four_bit=False) == {"models": ["/models/llama-3-8b"]}
    assert probe_questions({NAME: {"model": "m", "load_in_4bit": False}}) == {"models": ["m"]}
    assert probe_questions({"hf-text-classification": {}, "sklearn-text": {}}) == {}


def test_the_estimate_comes_from_the_config_the_host_read():
    report = {"models": {"/models/llama-3-8b": {"found": "dir", "config": LLAMA_8B}},
              "four_bit": {"ok": True, "version": "0.45.5", "problem": None, "device": "cuda:0"}}
    needs = assess(OPTIONS, report, "gpu.example.org")
    assert needs.problems == [] and 35000 < needs.gpu_mb < 45000  # 8 sequences of 512 tokens, no checkpointing
    assert needs.by == "hf-llm-finetune's estimate for /models/llama-3-8b"
    assert needs.notes[0] == "4-bit: bitsandbytes 0.45.5 loads 4-bit weights on gpu.example.org (cuda:0)"
    assert needs.notes[1] == "/models/llama-3-8b: 8.03 B parameters, 16.06 GB in 16 bits"  # Llama-3-8B: 8.03 B
    assert needs.notes[2].startswith("/models/llama-3-8b needs about ") and needs.notes[2].endswith(
        " of GPU memory to train at 4-bit (batch_size 8, max_length 512)")


@pytest.mark.parametrize("models, four_bit", [
    (["not", "a", "mapping"], "broken"),
    ({"/models/llama-3-8b": "a string"}, ["a list"]),
    ({"/models/llama-3-8b": {"found": "dir", "config": {"hidden_size": "huge", "text_config": 7}}}, None),
    ({"/models/llama-3-8b": {"found": "dir", "config": {"text_config": [1, 2]}}}, {}),
])
def test_a_host_answering_in_other_shapes_gets_no_estimate_and_breaks_nothing(models, four_bit):
    needs = assess(OPTIONS, {"models": models, "four_bit": four_bit, "executable": "/usr/bin/python3"}, "h")
    assert needs.gpu_mb is None
    assert all("\n" not in line for line in needs.problems + needs.notes)


def test_what_a_host_says_is_quoted_on_one_short_line():
    report = {"four_bit": {"ok": False, "version": None, "problem": "x" * 5000 + "\nsecond line"},
              "executable": "/opt/py\nthon"}
    problem, = assess(OPTIONS, report, "gpu.example.org").problems
    assert problem == (
        f"4-bit base weights need bitsandbytes on gpu.example.org, but /opt/py there cannot use it ({'x' * MAX_SAID}). "
        "Fix: add \"bitsandbytes\" to the backend's packages (or pip install it into that interpreter), or set "
        "load_in_4bit: false")


def test_a_hub_id_not_in_the_hosts_cache_is_refused_only_while_the_host_is_offline():
    hub = {NAME: {"model": "Qwen/Qwen2.5-7B-Instruct", "load_in_4bit": False}}
    offline = assess(hub, {"models": {"Qwen/Qwen2.5-7B-Instruct": {"found": "not-cached", "offline": True}}}, "gpu")
    assert offline.problems == [
        "The model 'Qwen/Qwen2.5-7B-Instruct' is not on gpu and Hugging Face Hub downloads are off there "
        "(HF_HUB_OFFLINE=1): download it on a machine with network access (`hf download Qwen/Qwen2.5-7B-Instruct "
        "--local-dir DIR`), copy DIR to gpu and set model to that directory"]
    online = assess(hub, {"models": {"Qwen/Qwen2.5-7B-Instruct": {"found": "not-cached", "offline": False}}}, "gpu")
    assert online.problems == [] and online.notes == [
        "Qwen/Qwen2.5-7B-Instruct is not in the Hugging Face cache on gpu: the run downloads it there"]
