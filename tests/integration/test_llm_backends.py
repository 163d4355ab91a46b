"""hf-llm-finetune on the remote backends: what the ssh probe checks for it, and its runs on every backend.

The GPU host is this machine through the session's real sshd, logging in as
the unprivileged test user; the tiny models (tests/support/llm_tasks.py) are
made readable to it. What the probe checks before a run copies anything: the
model's directory, whether bitsandbytes loads 4-bit weights there, and the
GPU memory the run needs, which ``gpus: auto`` asks of a GPU (the fake
``nvidia-smi`` stands in for GPUs).

Runs on every backend go through one project served by a real ``potato
start`` (tests/support/faults.py's bench: ssh, the real single-node SLURM, a
real ``potato training agent``, and a two-process data-parallel ssh backend),
with a radio schema and a text schema; after each run, nothing of it is left
on this machine, the host, SLURM's queue or the agent's machine.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from potato.training.trainers import hf_llm_finetune
from tests.support.faults import open_bench
from tests.support.llm_tasks import CUSTOMER
from tests.support.potato_project import make_project
from tests.support.remote_host import assert_host_clean
from tests.support.runs import potato, run_dir_of, store_of, wait_for

pytest.importorskip("bitsandbytes")
pytestmark = [pytest.mark.sshd, pytest.mark.prefect, pytest.mark.training]

BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / "python3")  # no torch there
# Free memory the tiny model's runs are judged against (it needs far less than min_free_gpu_mb at batch 8).
GPUS = [
    {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920, "memory_used": 80000,
     "memory_free": 1920, "utilization_gpu": 2, "pci_bus_id": "00000000:07:00.0", "compute_cap": "8.0"},
    {"index": 1, "name": "NVIDIA RTX A6000", "memory_total": 49140, "memory_used": 46140,
     "memory_free": 3000, "utilization_gpu": 0, "pci_bus_id": "00000000:0F:00.0", "compute_cap": "8.6"},
]
# Options whose estimate for the tiny model is about 4 GB: more than min_free_gpu_mb and than these GPUs have.
HUNGRY = {"batch_size": 64, "max_length": 8192, "load_in_4bit": True}


def readable_on_the_host(model: str) -> str:
    """*model*'s directory, made readable by the ssh user (the trainer loads it on the host)."""
    for path in [Path(model), *Path(model).rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return model


@pytest.fixture(scope="module")
def host_llama(tiny_llama):
    return readable_on_the_host(tiny_llama)


@pytest.fixture(scope="module")
def host_gpt2(tiny_gpt2):
    return readable_on_the_host(tiny_gpt2)


@pytest.fixture(scope="module")
def no_bitsandbytes():
    """A directory whose bitsandbytes fails to import, put first on the host interpreter's path."""
    directory = Path(tempfile.mkdtemp(prefix="potato-no-bnb-"))
    directory.chmod(0o755)
    (directory / "bitsandbytes.py").write_text(
        'raise ModuleNotFoundError("No module named \'bitsandbytes\'", name="bitsandbytes")\n')
    (directory / "bitsandbytes.py").chmod(0o644)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def llm_project(root: Path, host: str, model: str, *, trainer=None, **backend) -> Path:
    options = {"model": model, "load_in_4bit": True, "epochs": 1, "batch_size": 8, "max_length": 96}
    options.update(trainer or {})
    entry = {"type": "ssh", "host": host, **{k: str(v) if isinstance(v, Path) else v for k, v in backend.items()}}
    return make_project(root, n_items=40, labeled_fraction=0.9, model_training={
        "enabled": True, "backend": "gpu-server", "max_wall_seconds": 600,
        "writeback": {"schemas": ["sentiment"], "include_unlabeled": True, "min_confidence": 0.5},
        "trainers": {"hf-llm-finetune": options}, "auto_retrain": {"trainer": "hf-llm-finetune"},
        "backends": {"gpu-server": entry},
    })


def estimate_mb(model: str, **options) -> int:
    return hf_llm_finetune.gpu_memory_mb(dict({"model": model, "load_in_4bit": True, "batch_size": 8,
                                               "max_length": 96}, **options))


def test_check_says_whether_4_bit_works_on_the_host_and_what_memory_a_run_needs(
        sshd_service, ssh_user_config, host_llama, tmp_path):
    config = llm_project(tmp_path, ssh_user_config, host_llama, python=sshd_service.python)
    done = potato("training", "check", "gpu-server", str(config), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    import bitsandbytes

    assert f"4-bit: bitsandbytes {bitsandbytes.__version__} loads 4-bit weights on {ssh_user_config} (cpu)" in \
        report["report"]
    estimate = [line for line in report["report"] if line.startswith(f"{host_llama} needs about ")]
    assert estimate and estimate[0].endswith("of GPU memory to train at 4-bit (batch_size 8, max_length 96)")
    assert report["gpu_memory_mb"] == estimate_mb(host_llama)
    assert report["four_bit"]["ok"] is True


@pytest.mark.parametrize("case", ["bitsandbytes missing", "no model directory"])
def test_a_run_the_host_cannot_train_stops_at_the_probe_naming_the_host(
        prefect_api, sshd_service, ssh_user_config, host_llama, no_bitsandbytes, tmp_path, case):
    if case == "bitsandbytes missing":
        config = llm_project(tmp_path, ssh_user_config, host_llama, python=sshd_service.python,
                             env={"PYTHONPATH": str(no_bitsandbytes)})
        expected = (f"4-bit base weights need bitsandbytes on {ssh_user_config}, but {sshd_service.python} there "
                    "cannot use it (ModuleNotFoundError: No module named 'bitsandbytes'). Fix: add \"bitsandbytes\" "
                    "to the backend's packages (or pip install it into that interpreter), or set load_in_4bit: false")
    else:
        missing = str(tmp_path / "models" / "llama-3-8b")
        config = llm_project(tmp_path, ssh_user_config, missing, python=sshd_service.python)
        expected = (f"model '{missing}' is not a directory on {ssh_user_config}; set model to a model directory "
                    "there or to a Hugging Face hub id")
    done = potato("training", "run", str(config), "--trainer", "hf-llm-finetune")
    assert done.returncode == 1
    run = store_of(config).get_run(1)
    assert (run.state, run.error) == ("failed", expected)
    log = (run_dir_of(config, 1) / "run.log").read_text()
    assert "Copied Potato's code" not in log and "Started the agent" not in log  # said before anything ran there
    check = potato("training", "check", "gpu-server", str(config))
    assert f"A run could not start: {expected}" in check.stdout and check.returncode == 1
    assert_host_clean(sshd_service, config)


def test_gpus_auto_asks_a_gpu_for_the_runs_estimate_when_it_is_more_than_min_free_gpu_mb(
        prefect_api, sshd_service, ssh_user_config, host_llama, fake_gpus, tmp_path):
    # The host's interpreter without torch: its GPUs are not judged for kernels, and the run stops at the
    # missing packages once the GPU is chosen, before anything trains.
    gpus = fake_gpus(GPUS)
    needed = estimate_mb(host_llama, **HUNGRY)
    assert 3000 < needed < 9000
    by = f"hf-llm-finetune's estimate for {host_llama}"
    config = llm_project(tmp_path, ssh_user_config, host_llama, python=BASE_PYTHON, trainer=HUNGRY)
    done = potato("training", "run", str(config), "--trainer", "hf-llm-finetune")
    assert done.returncode == 1
    refusal = f"No GPU has {needed} MB free ({by}). Fix: wait, set trainer options that need less memory"
    assert store_of(config).get_run(1).error.startswith(refusal)
    check = potato("training", "check", "gpu-server", str(config))
    assert f"A run could not start: {refusal}" in check.stdout

    gpus.write_text(json.dumps(GPUS + [dict(GPUS[1], index=2, memory_free=9000, pci_bus_id="00000000:84:00.0")]))
    done = potato("training", "run", str(config), "--trainer", "hf-llm-finetune")
    log = (run_dir_of(config, 2) / "run.log").read_text()
    assert f"gpus: auto takes a GPU with {needed} MB free ({by}), more than min_free_gpu_mb (2000)" in log
    assert "The run uses GPU 2 (NVIDIA RTX A6000) (most free memory: 9000 MB)" in log
    assert "A run would take GPU 2 (NVIDIA RTX A6000)" in potato("training", "check", "gpu-server", str(config)).stdout
    assert_host_clean(sshd_service, config)


# -- every backend ----------------------------------------------------------------------------------------------

# One epoch: these runs prove the path, not learning (test_llm_worker.py's learning test does that).
LLM_OPTIONS = {"load_in_4bit": True, "epochs": 1, "learning_rate": 1e-2, "batch_size": 8, "max_length": 96,
               "max_new_tokens": 8}
TWO_PROCESSES = "gpu-server-2"


def add_text_schema_and_two_processes(config: Path) -> None:
    """A text schema ``customer`` answered by every annotator who labelled an item's sentiment, and an ssh
    backend that trains in two processes (gloo on the CPU, as two GPUs would)."""
    data = yaml.safe_load(config.read_text())
    data["annotation_schemes"].append({"annotation_type": "text", "name": "customer",
                                       "description": "Who wrote this review?"})
    backends = data["model_training"]["backends"]
    backends[TWO_PROCESSES] = dict(backends["gpu-server"], processes=2)
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    for path in config.parent.glob("annotation_output/*/user_state.json"):
        state = json.loads(path.read_text())
        for answers in state["instance_id_to_label_to_value"].values():
            label = next(value for key, value in answers if key["schema"] == "sentiment")
            answers.append([{"schema": "customer", "name": "text_box"}, CUSTOMER[label]])
        path.write_text(json.dumps(state, indent=2))


@pytest.fixture(scope="module")
def llm_bench(prefect_api, sshd_service, slurm_service, ssh_proxy, host_llama, tmp_path_factory):
    with open_bench(tmp_path_factory.mktemp("llm-backends"), (sshd_service, slurm_service), ssh_proxy,
                    Path(host_llama), prepare=add_text_schema_and_two_processes,
                    trainers={"hf-llm-finetune": dict(LLM_OPTIONS, model=host_llama)}) as bench:
        yield bench
        bench.stop_agents()


def start_llm_run(bench, backend: str, schemas, request, **options) -> tuple[int, Path | None]:
    """Start a hf-llm-finetune run on *backend* (an agent polling for it, on the agent backend)."""
    workdir = None
    if backend == "lab":
        workdir = bench.root / "agents" / request.node.name.replace("[", "-").replace("]", "")
        bench.start_agent(workdir)
    status, body = bench.server.api("POST", "runs", {"trainer": "hf-llm-finetune", "schemas": list(schemas),
                                                     "backend": backend, "options": options})
    assert status == 201, body
    return body["run"]["id"], workdir


def predictions_of(bench, run_id: int) -> dict[str, dict[str, dict]]:
    """``{schema: {item id: prediction}}`` from the run's predictions.jsonl on the server."""
    found: dict[str, dict[str, dict]] = {}
    for line in (bench.run_dir(run_id) / "predictions.jsonl").read_text().splitlines():
        record = json.loads(line)
        found.setdefault(record["schema"], {})[record["id"]] = record
    return found


@pytest.mark.parametrize("backend, family", [
    ("gpu-server", "llama"), pytest.param("cluster", "gpt2", marks=pytest.mark.slow),
    pytest.param("lab", "llama", marks=pytest.mark.slow)])
def test_an_llm_run_trains_4_bit_adapters_and_predicts_every_item_on_every_backend(
        llm_bench, host_gpt2, backend, family, request):
    bench = llm_bench
    # GPT-2: no chat template and no pad token, unlike the Llama
    options = {"model": host_gpt2} if family == "gpt2" else {}
    run_id, workdir = start_llm_run(bench, backend, ["sentiment", "customer"], request, **options)
    run = bench.wait_for_end(run_id, timeout=600)
    log = bench.run_log(run_id)
    assert (run.state, run.error) == ("succeeded", None), log[-4000:]
    modules = {"llama": 14, "gpt2": 8}[family]  # every linear layer: 7 a Llama layer, 4 a GPT-2 one, 2 layers
    assert f"base weights in 4-bit NF4 (bitsandbytes), LoRA r=8 on {modules} modules" in log
    predicted = predictions_of(bench, run_id)
    unlabelled = {item for item in predicted["sentiment"] if item.startswith("m")}  # data/more.jsonl: nobody's
    assert len(unlabelled) == 6 and set(predicted["customer"]) == set(predicted["sentiment"])
    assert all(p["label"] in ("positive", "negative") and 0.5 <= p["confidence"] <= 1
               for p in predicted["sentiment"].values())
    assert all(isinstance(p["text"], str) for p in predicted["customer"].values())
    assert run.scores["sentiment"]["n"] > 0 and run.scores["sentiment"]["accuracy"] is not None
    assert run.scores["customer"]["n"] > 0 and "exact_match" in run.scores["customer"]
    if backend == "lab":  # the model stays on the agent's machine, as artifact_uri says
        adapters = list(workdir.glob("jobs/*/artifacts/sentiment/adapter_config.json"))
    else:  # fetched back to the server
        adapters = [bench.run_dir(run_id) / "artifacts" / name / "adapter_config.json" for name in ("sentiment", "customer")]
    assert adapters and all(path.exists() for path in adapters), log[-3000:]
    assert not any(path.with_name("model.safetensors").exists() for path in adapters)  # the adapter, not a base copy
    bench.assert_nothing_left(run_id, agent_workdir=workdir)


@pytest.mark.slow
def test_an_llm_run_trains_data_parallel_in_two_processes(llm_bench, request):
    bench = llm_bench
    run_id, _ = start_llm_run(bench, TWO_PROCESSES, ["sentiment"], request)
    run = bench.wait_for_end(run_id, timeout=600)
    log = bench.run_log(run_id)
    assert (run.state, run.error) == ("succeeded", None), log[-4000:]
    assert "Schema 'sentiment': trained data-parallel on 2 devices (gloo)" in log
    assert len(predictions_of(bench, run_id)["sentiment"]) == 46
    assert (bench.run_dir(run_id) / "artifacts" / "sentiment" / "adapter_config.json").exists()
    bench.assert_nothing_left(run_id)


@pytest.mark.parametrize("backend, phase", [
    ("gpu-server", "train"), ("gpu-server", "predict"),
    pytest.param("cluster", "train", marks=pytest.mark.slow), pytest.param("lab", "train", marks=pytest.mark.slow)])
def test_cancel_mid_training_or_mid_generation_leaves_nothing_running(llm_bench, backend, phase, request):
    bench = llm_bench
    # Mid-generation: a barely trained model rarely ends an answer, so each one runs to max_new_tokens.
    options = {"epochs": 1000} if phase == "train" else {"learning_rate": 1e-9, "max_new_tokens": 400,
                                                          "max_length": 512}
    run_id, workdir = start_llm_run(bench, backend, ["customer"], request, **options)
    bench.wait_for_event(run_id, lambda e: e.kind == "progress" and e.data.get("phase") == phase, 300,
                         f"run {run_id} to be in its {phase} phase")  # each phase says so as it starts
    asked = time.monotonic()
    status, body = bench.server.api("POST", f"runs/{run_id}/cancel")
    assert status in (200, 202), body
    run = bench.wait_for_end(run_id, timeout=60)
    log = bench.run_log(run_id)
    assert run.state == "cancelled", log[-3000:]
    assert time.monotonic() - asked < 30
    assert "Schema 'customer': holdout" not in log  # stopped in the phase it was in, not after it
    bench.assert_nothing_left(run_id, agent_workdir=workdir)


@pytest.mark.slurm
def test_a_slurm_check_estimates_from_the_login_nodes_copy_of_the_model(
        sshd_service, ssh_user_config, host_llama, tmp_path):
    entry = {"type": "slurm", "host": ssh_user_config, "python": BASE_PYTHON, "job_python": str(sshd_service.python),
             "remote_dir": str(sshd_service.shared_dir / "potato-training"), "gres": "gpu:1"}
    missing = str(tmp_path / "not-here")
    config = make_project(tmp_path, n_items=4, model_training={
        "enabled": True, "backends": {"cluster": entry},
        "trainers": {"hf-llm-finetune": {"model": host_llama, "load_in_4bit": True, "max_length": 96}}})
    lines = potato("training", "check", "cluster", str(config)).stdout.splitlines()
    at = next(k for k, line in enumerate(lines) if line.startswith(f"{host_llama} needs about "))
    assert lines[at - 1].startswith(f"{host_llama}: ") and " parameters, " in lines[at - 1]  # its size first
    assert lines[at].endswith("of GPU memory to train at 4-bit (batch_size 8, max_length 96)")
    assert lines[at + 1] == ("4-bit: whether bitsandbytes works on the compute nodes shows in the job's log (the "
                             "login node cannot see their packages)")
    config.write_text(config.read_text().replace(host_llama, missing))
    done = potato("training", "check", "cluster", str(config))
    assert f"Login node: model '{missing}' is not a directory on {ssh_user_config}; set model to a model " \
           "directory there or to a Hugging Face hub id" in done.stdout.splitlines()
    assert done.returncode == 0  # the login node may not see what the compute nodes do: said, not refused
