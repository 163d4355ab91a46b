"""The speed work's pure parts: the trainer's batching, the data-parallel plan, merging the processes' events,
the streamed predictions file, and which processes a backend's job asks for."""

from __future__ import annotations

import json
import random

import pytest

from potato.config import BackendConfig
from potato.runs.jobs import processes_for
from potato.training.data_parallel import PlanError, check_processes, plan_processes
from potato.training.events import EventWriter, read_events
from potato.training.predictions import PredictionStream, publish_parts
from potato.training.rank_events import RankEvents, describe_devices
from potato.training.trainers import hf_common as hf

# -- batches -----------------------------------------------------------------------


def test_length_grouped_batches_cover_every_item_once_pad_little_and_stay_random():
    rng = random.Random(0)
    lengths = [rng.choice([3, 8, 40, 120, 256]) for _ in range(1000)]
    epochs = [hf.length_grouped_batches(lengths, 16, random.Random(seed)) for seed in (1, 2)]
    for batches in epochs:
        assert sorted(k for b in batches for k in b) == list(range(1000))
        assert all(1 <= len(b) <= 16 for b in batches)
        # Padded tokens: each batch padded to its own longest, against a random batching's.
        padded = sum(len(b) * max(lengths[k] for k in b) for b in batches)
        order = list(range(1000))
        random.Random(3).shuffle(order)
        plain = sum(16 * max(lengths[k] for k in order[i:i + 16]) for i in range(0, 1000, 16))
        assert padded < plain / 2
        assert max(lengths[k] for k in batches[0]) == 256  # the longest goes first: an OOM shows at once
    assert epochs[0] != epochs[1]  # shuffled groups and batch order: another seed, other batches
    assert hf.length_grouped_batches(lengths, 16, random.Random(1)) == epochs[0]  # and the same seed, the same


def test_token_budget_batches_put_short_texts_in_large_batches():
    lengths = {0: 200, 1: 200, 2: 100, 3: 10, 4: 10, 5: 10, 6: 10, 7: 10}
    order = sorted(lengths, key=lengths.get, reverse=True)
    assert hf.token_budget_batches(order, lengths.get, budget=400, max_rows=4) == [[0, 1], [2, 3, 4, 5], [6, 7]]
    assert hf.token_budget_batches([0], {0: 5000}.get, budget=400, max_rows=4) == [[0]]  # one text over budget
    assert hf.token_budget_batches([], {}.get, budget=400, max_rows=4) == []


def test_estimated_tokens_are_capped_at_max_length():
    assert hf.estimated_tokens(0, 256) == 2
    assert hf.estimated_tokens(400, 256) == 102
    assert hf.estimated_tokens(4000, 256) == 256
    assert hf.estimated_tokens(400, 256, 16) == 112 and hf.estimated_tokens(4000, 250, 16) == 256


# -- the plan ----------------------------------------------------------------------

GPUS = [("cuda:0", "CUDA 0: NVIDIA H200 (141 GB)"), ("cuda:1", "CUDA 1: NVIDIA H200 (141 GB)")]


@pytest.mark.parametrize("processes, device, cuda, expected", [
    (None, "cuda:0", GPUS, (1, ["cuda:0"], None)),
    (1, "cuda:0", GPUS, (1, ["cuda:0"], None)),
    ("per_gpu", "cuda:0", GPUS, (2, ["cuda:0", "cuda:1"], "nccl")),      # ssh gpus "0,1", slurm gpu:2
    ("per_gpu", "cuda:0", GPUS[:1], (1, ["cuda:0"], None)),
    (2, "cuda:0", GPUS, (2, ["cuda:0", "cuda:1"], "nccl")),
    ("per_gpu", "cpu", [], (1, ["cpu"], None)),                          # no GPU: one process
    (2, "cpu", [], (2, ["cpu", "cpu"], "gloo")),                         # the CPU path, for trying it
])
def test_plan(processes, device, cuda, expected):
    plan = plan_processes(processes, device, "the device", cuda, threads=4)
    assert (plan.size, plan.devices, plan.backend) == expected


def test_cpu_processes_share_the_threads_and_are_named_for_people():
    plan = plan_processes(2, "cpu", "CPU (4 threads)", [], threads=4)
    assert plan.threads == 2 and plan.names == ["CPU (2 threads)"] * 2
    assert plan_processes(3, "cpu", "CPU (2 threads)", [], threads=2).names == ["CPU (1 thread)"] * 3
    assert describe_devices(plan.names) == "2 × CPU (2 threads)"
    assert describe_devices([n for _, n in GPUS]) == "CUDA 0: NVIDIA H200 (141 GB), CUDA 1: NVIDIA H200 (141 GB)"


def test_more_processes_than_gpus_is_refused_with_the_fix():
    with pytest.raises(PlanError) as caught:
        plan_processes(3, "cuda:0", "CUDA 0", GPUS, threads=None)
    assert str(caught.value) == ("processes is 3, but this machine has 2 GPUs torch can use; "
                                 "give the run 3 GPUs or lower processes")


def test_apple_metal_trains_in_one_process_and_says_so():
    plan = plan_processes(2, "mps", "Apple Metal (mps)", [], threads=None)
    assert plan.size == 1 and plan.warning == "Apple Metal trains in one process; processes: 2 is ignored"


@pytest.mark.parametrize("value, ok", [(None, True), (1, True), (4, True), ("per_gpu", True),
                                       (0, False), (True, False), ("2", False), (1.5, False)])
def test_check_processes(value, ok):
    assert (check_processes(value) is None) is ok


@pytest.mark.parametrize("backend, expected", [
    (None, None),
    (BackendConfig("local", "local", {}), None),
    (BackendConfig("local", "local", {"processes": 2}), 2),
    (BackendConfig("gpu", "ssh", {"host": "h"}), "per_gpu"),              # the GPUs the run chose
    (BackendConfig("gpu", "ssh", {"host": "h", "processes": 2}), 2),
    (BackendConfig("cluster", "slurm", {"host": "h", "gres": "gpu:2"}), "per_gpu"),
    (BackendConfig("lab", "agent", {}), None),
])
def test_job_processes_per_backend(backend, expected):
    assert processes_for(backend) == expected


# -- merging the processes' events ------------------------------------------------------


class _RankFile:
    """A process's events.jsonl, written by hand so each event's time is the test's to choose."""

    def __init__(self, path):
        path.parent.mkdir(parents=True)
        self.path, self.seq = path, 0

    def __call__(self, t, type_, **fields):
        self.seq += 1
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"seq": self.seq, "t": t, "type": type_, **fields}) + "\n")


def _ranks(tmp_path, n=2):
    ranks = [_RankFile(tmp_path / "ranks" / str(rank) / "events.jsonl") for rank in range(n)]
    out = EventWriter(str(tmp_path / "events.jsonl"), progress_interval=0)
    return ranks, RankEvents(str(tmp_path), n, out)


def _merged(tmp_path):
    return [{k: v for k, v in e.items() if k != "t"} for e in read_events(str(tmp_path / "events.jsonl"))[0]]


STARTED = {"python": "3.11.7", "device": "cpu", "device_name": "CPU (1 thread)",
           "trainer": "hf-text-classification", "schemas": ["s"]}


def test_the_processes_events_become_one_stream(tmp_path):
    (r0, r1), merger = _ranks(tmp_path)
    r0(1.0, "started", pid=11, **STARTED)
    r0(1.1, "log", level="info", message="Model m (full fine-tune)")
    r0(1.2, "progress", phase="train", step=0, total=4, epoch=0, schema="s")  # before rank 1 started: held
    r1(1.3, "log", level="info", message="Model m (full fine-tune)")  # rank 1's info repeats rank 0's: dropped
    merger.pump()
    assert [e["type"] for e in _merged(tmp_path)] == ["log"]
    r1(1.4, "started", pid=12, **STARTED)
    r0(2.0, "progress", phase="train", step=4, total=4, epoch=1.0, loss=0.25, schema="s")
    r1(2.0, "progress", phase="train", step=4, total=4, epoch=1.0, loss=0.3, schema="s")  # rank 0 has the mean
    r0(2.1, "progress", phase="predict", step=1, total=3, schema="s")
    r1(2.2, "progress", phase="predict", step=1, total=2, schema="s")
    r1(2.3, "log", level="warning", message="disk almost full")
    r1(2.4, "progress", phase="predict", step=2, total=2, schema="s")
    r0(2.5, "progress", phase="predict", step=3, total=3, schema="s")
    r0(2.6, "metrics", scores={"s": {"accuracy": 1.0, "macro_f1": 1.0, "n": 2}})
    r0(2.7, "done", status="succeeded")
    r1(2.5, "done", status="succeeded")
    merger.pump()
    merged = _merged(tmp_path)
    assert [e["seq"] for e in merged] == list(range(1, len(merged) + 1))
    assert merged[1] == {"seq": 2, "type": "started", "pid": merged[1]["pid"], **STARTED,
                         "device_name": "2 × CPU (1 thread)"}
    progress = [(e["phase"], e["step"], e["total"]) for e in merged if e["type"] == "progress"]
    assert progress == [("train", 0, 4), ("train", 4, 4), ("predict", 2, 5), ("predict", 3, 5), ("predict", 5, 5)]
    assert [e["loss"] for e in merged if e["type"] == "progress" and "loss" in e] == [0.25]
    assert {"seq": 6, "type": "log", "level": "warning", "message": "rank 1: disk almost full"} in merged
    assert merged[-1]["type"] == "metrics" and "done" not in [e["type"] for e in merged]


def _exit(tmp_path, rank, code):
    (tmp_path / "ranks" / str(rank) / "exit_code").write_text("{}\n".format(code))


def test_outcome_is_the_first_failure_or_cancelled(tmp_path):
    (r0, r1), merger = _ranks(tmp_path)
    _exit(tmp_path, 0, 0)
    _exit(tmp_path, 1, 0)
    assert merger.outcome(False, None) == (0, "succeeded", None)
    assert merger.outcome(True, None) == (143, "cancelled", "Cancelled")

    memory = "The worker used 2100 MB of memory, over model_training.max_ram_mb (2000); raise max_ram_mb …"
    r1(5.0, "done", status="failed", error=memory)
    r0(5.2, "done", status="failed", error="RuntimeError: Connection closed by peer")  # because rank 1 left
    merger.pump()
    _exit(tmp_path, 0, 1)
    _exit(tmp_path, 1, 4)
    assert merger.outcome(False, RuntimeError("ChildFailedError")) == (4, "failed", "rank 1: " + memory)


def test_the_same_failure_everywhere_is_reported_as_rank_0s(tmp_path):
    (r0, r1), merger = _ranks(tmp_path)
    r1(5.0, "done", status="failed", error="model '/x' is not a directory on this machine")
    r0(5.1, "done", status="failed", error="model '/x' is not a directory on this machine")
    merger.pump()
    _exit(tmp_path, 0, 1)
    _exit(tmp_path, 1, 1)
    assert merger.outcome(False, None) == (1, "failed", "model '/x' is not a directory on this machine")


def test_a_process_that_died_without_a_word_is_named(tmp_path):
    _, merger = _ranks(tmp_path)
    _exit(tmp_path, 0, 143)
    assert merger.outcome(False, RuntimeError("process 1 terminated with signal SIGKILL")) == (
        1, "failed", "Training process 1 ended without reporting how "
                     "(RuntimeError: process 1 terminated with signal SIGKILL); see worker.log")


# -- predictions.jsonl, streamed ------------------------------------------------------------


def test_predictions_appear_only_when_published(tmp_path):
    stream = PredictionStream(str(tmp_path))
    stream.write({"id": "a", "schema": "s", "label": "x", "confidence": 0.9})
    assert not (tmp_path / "predictions.jsonl").exists()
    stream.publish()
    assert json.loads((tmp_path / "predictions.jsonl").read_text())["id"] == "a"
    stopped = PredictionStream(str(tmp_path))
    stopped.write({"id": "b"})
    stopped.discard()
    assert [p.name for p in tmp_path.iterdir()] == ["predictions.jsonl"]


def test_the_ranks_parts_are_joined_in_rank_order(tmp_path):
    for rank, ids in ((0, "ac"), (1, "b")):
        part = PredictionStream(str(tmp_path), rank)
        for i in ids:
            part.write({"id": i})
        part.close()
    publish_parts(str(tmp_path), [0, 1])
    lines = (tmp_path / "predictions.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "c", "b"]
    assert not list(tmp_path.glob("ranks/*/predictions.part"))


def test_the_item_index_keeps_labelled_items_and_reads_the_others_back(tmp_path):
    from potato.training.worker import ItemIndex

    path = tmp_path / "items.jsonl"
    rows = [{"id": "a", "text": "Great", "labels": {"s": "pos"}, "holdout": True},
            {"id": "b", "text": "ünïcode text, read back by its offset", "labels": {}},
            {"id": "c", "text": None, "labels": {}}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" + ("\n" if k == 0 else "")
                            for k, r in enumerate(rows)), encoding="utf-8")
    index = ItemIndex(str(path))
    assert len(index) == 3 and list(index.labelled) == [0]
    assert [index.read(i) for i in (2, 1, 0)] == [("c", ""), ("b", rows[1]["text"]), ("a", "Great")]
    assert list(index.text_lengths) == [5, len(rows[1]["text"]), 0]
    assert index.labels(0) == {"s": "pos"} and index.labels(1) == {}
    index.close()


def test_a_job_without_processes_reads_as_one_process(tmp_path):
    from potato.training.worker import Job

    assert Job(str(tmp_path), {}).processes is None
    assert Job(str(tmp_path), {"processes": "per_gpu"}).processes == "per_gpu"


def test_padding_multiples_never_pass_the_models_positions():
    import torch

    dev = hf.ComputeDevice(torch, "cpu", "fp32")
    dev.pad_multiple, dev.predict_pad_multiple = 8, 16  # as on CUDA / on a CPU predicting in bf16
    dev.fit_padding(128, 512)
    assert (dev.pad_multiple, dev.predict_pad_multiple) == (8, 16)
    dev.fit_padding(250, 250)  # 256 would index past the 250 position embeddings
    assert (dev.pad_multiple, dev.predict_pad_multiple) == (1, 1)
    dev.pad_multiple, dev.predict_pad_multiple = 8, 16
    dev.fit_padding(200, None)  # the model does not say: no further than max_length
    assert (dev.pad_multiple, dev.predict_pad_multiple) == (8, 1)
