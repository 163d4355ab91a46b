"""hf-llm-finetune through the real flow on the local backend: the CLI, a real Prefect API, the real worker.

A tiny Llama (4-bit base weights) built on the project's own texts; the
project's radio schema is trained, every item predicted and written back.
"""

from __future__ import annotations

import json

import pytest

from tests.support.potato_project import item_text, make_project, true_label
from tests.support.runs import potato, processes_matching, run_dir_of, store_of
from tests.support.tiny_llm import build_tiny_causal_lm

pytest.importorskip("bitsandbytes")
pytestmark = [pytest.mark.prefect, pytest.mark.training]


def test_a_local_llm_run_trains_a_4_bit_adapter_predicts_every_item_and_writes_back(prefect_api, tmp_path):
    n = 60
    texts = [item_text(i, true_label(i)) for i in range(n)]
    model = build_tiny_causal_lm(tmp_path / "tiny-llama", texts * 3 + ["positive negative Answer with one of"] * 20)
    config = make_project(tmp_path, n_items=n, labeled_fraction=0.9, model_training={
        "enabled": True,
        "max_wall_seconds": 600,
        "num_threads": 1,  # a tiny model on a loaded two-core machine: one thread waits on no other
        "writeback": {"schemas": ["sentiment"], "include_unlabeled": True, "min_confidence": 0.5},
        "trainers": {"hf-llm-finetune": {"model": str(model), "load_in_4bit": True, "epochs": 6,
                                         "learning_rate": 1e-2, "batch_size": 8, "max_length": 96}},
    })
    done = potato("training", "run", str(config), "--trainer", "hf-llm-finetune")

    assert done.returncode == 0, done.stdout + done.stderr
    assert "Run 1 queued: hf-llm-finetune on sentiment, runs on local (this machine)" in done.stdout
    assert "Holdout scores:\n  sentiment: accuracy " in done.stdout
    run = store_of(config).get_run(1)
    assert (run.state, run.backend, run.error) == ("succeeded", "local", None)
    assert run.scores["sentiment"]["n"] > 0 and run.scores["sentiment"]["accuracy"] is not None

    directory = run_dir_of(config, 1)
    predictions = [json.loads(line) for line in (directory / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["id"] for p in predictions) == sorted(f"r{i}" for i in range(n))
    assert all(p["label"] in ("positive", "negative") and 0.5 <= p["confidence"] <= 1 for p in predictions)
    assert (directory / "artifacts" / "sentiment" / "adapter_config.json").exists()
    assert not (directory / "artifacts" / "sentiment" / "model.safetensors").exists()
    log = (directory / "run.log").read_text()
    assert "Model: {}, ".format(model) in log and "base weights in 4-bit NF4 (bitsandbytes), LoRA r=8 on 14 modules" in log
    written = [json.loads(line) for line in
               (config.parent / "annotation_output/training/predictions.jsonl").read_text().splitlines()]
    assert written and all(w["predictions"]["sentiment"]["run_id"] == 1 for w in written)
    assert processes_matching(str(tmp_path)) == []


def test_check_local_says_the_models_size_its_memory_4_bit_and_a_rough_time(tmp_path):
    import re

    from potato.training.trainers.llm_memory import parameter_counts, read_shape
    from potato.training.device import describe_local_device

    n = 40
    model = build_tiny_causal_lm(tmp_path / "tiny-llama", [item_text(i, true_label(i)) for i in range(n)])
    config = make_project(tmp_path, n_items=n, labeled_fraction=0.9, model_training={
        "enabled": True, "writeback": {"schemas": ["sentiment"], "include_unlabeled": True},
        "trainers": {"hf-llm-finetune": {"model": str(model)}}})
    done = potato("training", "check", "local", str(config))

    assert done.returncode == 0, done.stdout + done.stderr
    params = parameter_counts(read_shape(json.loads((model / "config.json").read_text())))["total"]
    lines = done.stdout.splitlines()
    assert lines[0] == f"local: this machine, {describe_local_device('auto')}"
    assert re.fullmatch(r"4-bit: bitsandbytes [\d.]+ loads 4-bit weights on this machine \(cpu\)", lines[1]), lines
    assert lines[2] == f"{model}: {params / 1e6:.1f} M parameters, {params * 2 / 1e9:.2f} GB in 16 bits"
    assert lines[3].startswith(f"{model} needs about ") and lines[3].endswith(
        " of GPU memory to train at 4-bit (batch_size 8, max_length 512)")
    rough = re.fullmatch(r"Rough time on cpu: at least \d+ (s|min|h) to train (\d+) item\(s\) for (\d+) epoch\(s\) "
                         r"\(at least 100 steps; early stopping may end it sooner\) "
                         rf"and predict {n} \(about \d+ tokens each, at the [\d.]+ GFLOP/s a matrix product "
                         r"reaches here\)", lines[4])
    assert rough and 0 < int(rough.group(2)) < n, lines  # the labelled items not held out
    # The epochs the schedule chooses for so few items: 100 steps of batches of 8 at the least.
    assert int(rough.group(3)) == -(-100 // -(-int(rough.group(2)) // 8)), lines
    assert len(lines) == 5
