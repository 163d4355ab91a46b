"""hf-span-tagging through the real worker: it must learn spans a tiny model can learn, exactly.

The task (tests/support/bundles.py, ``easy_span_items``): sentiment words and
two-token places marked as spans in text full of what moves offsets —
accents, HTML, quotes, CJK, an emoji, tabs and newlines — some texts past
one 32-token window. Exact-match F1 of 0.9 or more is only reachable when
the character offsets go to tokens and back right, in every window.
One thread per worker: the tiny model computes in microseconds, and on a
busy two-core machine a second OpenMP thread only waits (measured: 1.3 s
against 18 s to train).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from potato.training.events import EventWriter, TrainerFailure  # noqa: E402
from potato.training.worker import read_job  # noqa: E402
from tests.integration.test_worker import done_of, events_of, run_worker  # noqa: E402
from tests.support.bundles import SPAN_ANSWERS, SPAN_SCHEMAS, easy_items, easy_span_items, write_bundle, write_job  # noqa: E402
from tests.support.tiny_model import tiny_span_model_path  # noqa: E402

pytestmark = pytest.mark.training

TINY = {"epochs": 5, "learning_rate": 3e-3, "batch_size": 16, "max_length": 32, "stride": 8}


def span_job(job_dir: Path, items: list, **fields) -> Path:
    write_bundle(job_dir / "bundle", items, SPAN_SCHEMAS, SPAN_ANSWERS)
    options = dict(TINY, model=str(tiny_span_model_path()))
    options.update(fields.pop("options", {}))
    return write_job(job_dir, trainer="hf-span-tagging", schemas=["cues"], num_threads=1, options=options, **fields)


def spans_of(record_or_item: dict) -> set:
    spans = record_or_item["spans"] if "spans" in record_or_item else record_or_item["labels"]["cues"]
    return {(s["start"], s["end"], s["label"]) for s in spans}


def test_learns_spans_with_exact_character_offsets(tmp_path):
    items = easy_span_items(120, unlabeled=10)
    training = [it for it in items if it["labels"] and it["labels"]["cues"] and not it["holdout"]]
    # What BIO cannot hold: a span overlapping another (twice), one past the end of its text.
    for it in training[:2]:
        first = it["labels"]["cues"][0]
        it["labels"]["cues"].append(dict(first, end=first["end"] - 1))
    training[2]["labels"]["cues"].append({"start": 0, "end": len(training[2]["text"]) + 1, "label": "POS"})
    job = span_job(tmp_path / "job", items)

    result = run_worker(job)

    assert result.returncode == 0, result.stderr
    scores = json.loads((job / "scores.json").read_text())["cues"]
    assert scores["kind"] == "span" and scores["n"] == 24
    assert scores["f1"] >= 0.9, scores
    assert set(scores["per_label"]) == {"POS", "NEG", "LOC"} and all(v["f1"] >= 0.8 for v in scores["per_label"].values())

    events = events_of(job)
    logs = [(e["level"], e["message"]) for e in events if e["type"] == "log"]
    assert ("info", "Loading trainer 'hf-span-tagging' and its packages") in logs
    model_line = next(m for _, m in logs if m.startswith("Model "))
    assert "(full fine-tune); 130 items; options: epochs=5, learning_rate=0.003, batch_size=16, max_length=32, " \
           "stride=8, seed=42, on CPU (" in model_line
    warnings = [m for level, m in logs if level == "warning"]
    assert warnings == [
        "Schema 'cues': 1 gold span left out: not inside the item's text, or with a label the schema does not have",
        "Schema 'cues': 2 gold spans left out of training: each overlaps an earlier span of its item, and a token "
        "has one tag (the holdout still scores them)",
    ]
    windows = next(m for _, m in logs if "windows" in m)
    assert windows.startswith("Schema 'cues': texts longer than max_length 32 tokens are read in windows of 32 "
                              "tokens overlapping by 8 (")
    holdout_line = next(m for _, m in logs if m.startswith("Schema 'cues': Holdout cues: span F1 "))
    assert holdout_line.endswith("model saved to {}".format(job / "artifacts" / "cues"))
    assert done_of(job)["status"] == "succeeded"

    predictions = {(p["id"]): p for p in map(json.loads, (job / "predictions.jsonl").read_text().splitlines())}
    assert set(predictions) == {it["id"] for it in items}
    for it in items:
        record = predictions[it["id"]]
        assert set(record) == {"id", "schema", "spans"} and record["schema"] == "cues"
        for span in record["spans"]:
            assert set(span) == {"start", "end", "label", "confidence"} and 0 < span["confidence"] <= 1
            assert 0 <= span["start"] < span["end"] <= len(it["text"])
            assert span["label"] in ("POS", "NEG", "LOC")
    # Long held-out texts, read in several windows: their spans come back exactly, far past the first window.
    long_held = [it for it in items if it["holdout"] and len(it["text"]) > 250]
    assert long_held
    for it in long_held:
        assert len(spans_of(predictions[it["id"]]) ^ spans_of(it)) <= 1
        assert max(s[0] for s in spans_of(predictions[it["id"]])) > 200

    saved = job / "artifacts" / "cues"
    info = json.loads((saved / "labels.json").read_text())
    assert info == {**info, "trainer": "hf-span-tagging", "labels": ["POS", "NEG", "LOC"], "stride": 8,
                    "tags": ["O", "B-POS", "I-POS", "B-NEG", "I-NEG", "B-LOC", "I-LOC"], "kind": "full"}
    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(saved)
    assert model.config.id2label[5] == "B-LOC"


def test_learns_data_parallel_in_two_processes(tmp_path):
    job = span_job(tmp_path / "job", easy_span_items(120, unlabeled=6), processes=2)

    result = run_worker(job, timeout=180)

    assert result.returncode == 0, result.stderr
    logs = [e["message"] for e in events_of(job) if e["type"] == "log"]
    assert "Schema 'cues': trained data-parallel on 2 devices (gloo)" in logs
    assert json.loads((job / "scores.json").read_text())["cues"]["f1"] >= 0.9
    assert len((job / "predictions.jsonl").read_text().splitlines()) == 126  # both processes' shares


@pytest.mark.filterwarnings("ignore::FutureWarning")  # peft calls a deprecated transformers API
def test_lora_saves_a_token_classification_adapter(tmp_path, monkeypatch):
    """In-process (the trainer's ``train(job, events)`` as the worker calls it): one epoch is enough to
    see what LoRA saves; a random tiny base does not learn much through LoRA."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    logs = train_here(span_job(tmp_path / "job", easy_span_items(20, unlabeled=2),
                               options={"lora": {"r": 4}, "epochs": 1}))

    assert next(e["message"] for e in logs if e["message"].startswith("Model ")).split("; ")[0].endswith("(LoRA r=4)")
    assert len((tmp_path / "job" / "predictions.jsonl").read_text().splitlines()) == 22
    saved = tmp_path / "job" / "artifacts" / "cues"
    adapter = json.loads((saved / "adapter_config.json").read_text())
    assert adapter["task_type"] == "TOKEN_CLS" and adapter["r"] == 4
    assert not (saved / "model.safetensors").exists()
    from peft import AutoPeftModelForTokenClassification

    tags = json.loads((saved / "labels.json").read_text())["tags"]
    # The base model's config has no tags: they come from labels.json (docs/trainers/hf-span-tagging.md);
    # the tiny base was saved with a 2-way head, which the adapter's own head replaces.
    model = AutoPeftModelForTokenClassification.from_pretrained(saved, id2label=dict(enumerate(tags)),
                                                                ignore_mismatched_sizes=True)
    assert model.config.id2label[6] == "I-LOC"


def train_here(job_dir: Path) -> list:
    """The trainer's ``train(job, events)`` in this process, as the worker calls it; returns its log events."""
    from potato.training.trainers import hf_span_tagging

    hf_span_tagging.train(read_job(str(job_dir)), EventWriter(str(job_dir / "events.jsonl")))
    return [e for e in events_of(job_dir) if e["type"] == "log"]


def test_a_long_max_length_a_wide_stride_and_spans_inside_tokens_are_said(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    items = easy_span_items(20, unlabeled=0)
    training = next(it for it in items if not it["holdout"] and any(
        it["text"][s["start"]:s["end"]] == "great" for s in it["labels"]["cues"]))
    for span in training["labels"]["cues"]:
        if training["text"][span["start"]:span["end"]] == "great":
            span["end"] -= 1  # "grea": the tiny tokenizer keeps "great" whole
    job = span_job(tmp_path / "job", items, options={"max_length": 512, "stride": 200, "epochs": 1})

    logs = train_here(job)

    warnings = [e["message"] for e in logs if e["level"] == "warning"]
    inexact = sum(1 for s in training["labels"]["cues"] if training["text"][s["start"]:s["end"]] == "grea")
    assert warnings == [
        "max_length 512 is more than the model takes; using its 128",
        "stride is more than half of max_length 128; using 64",
        "Schema 'cues': {} inside a token of the model's tokenizer; the model learns and predicts whole tokens "
        "there".format("1 gold span begins or ends" if inexact == 1 else "{} gold spans begin or end".format(inexact)),
    ]
    assert json.loads((job / "artifacts" / "cues" / "labels.json").read_text())["stride"] == 64


@pytest.mark.parametrize("problem", ["radio schema", "no span schema", "no labels", "slow tokenizer"])
def test_what_it_cannot_train_is_refused(tmp_path, monkeypatch, problem):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tiny_span_model_path()
    if problem in ("radio schema", "no span schema"):
        write_bundle(tmp_path / "job" / "bundle", easy_items(8, unlabeled=0))  # no answers: every schema nominal
        write_job(tmp_path / "job", trainer="hf-span-tagging", options={"model": str(model)},
                  schemas=["sentiment"] if problem == "radio schema" else [])
        expected = ("Schema 'sentiment' has nominal answers, which hf-span-tagging cannot train; it trains span "
                    "schemas" if problem == "radio schema" else
                    "The bundle has no schema hf-span-tagging can train; it trains span schemas")
    elif problem == "no labels":
        write_bundle(tmp_path / "job" / "bundle", easy_span_items(8, unlabeled=0), {"cues": []}, SPAN_ANSWERS)
        write_job(tmp_path / "job", trainer="hf-span-tagging", schemas=["cues"], options={"model": str(model)})
        expected = "Schema 'cues' has no labels to tag spans with"
    else:
        model = slow_tokenizer_model(model, tmp_path / "slow")
        span_job(tmp_path / "job", easy_span_items(8, unlabeled=0), options={"model": str(model)})
        expected = ("The model at {} has no fast tokenizer (tokenizer.json), which hf-span-tagging needs to map "
                    "tokens to characters: choose a model that has one".format(model))
    with pytest.raises(TrainerFailure) as failure:
        train_here(tmp_path / "job")
    assert str(failure.value) == expected


def slow_tokenizer_model(fast_model: Path, directory: Path) -> Path:
    """A copy of ``fast_model`` with the same vocabulary in a Python (slow) BERT tokenizer, and no tokenizer.json."""
    import shutil

    from transformers import AutoTokenizer
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    shutil.copytree(fast_model, directory)
    vocab = sorted(AutoTokenizer.from_pretrained(directory).get_vocab().items(), key=lambda kv: kv[1])
    (directory / "tokenizer.json").unlink()
    (directory / "vocab.txt").write_text("".join(token + "\n" for token, _ in vocab))
    BertTokenizerLegacy(str(directory / "vocab.txt")).save_pretrained(directory)
    return directory
