"""hf-llm-finetune on the remote backends: what the ssh probe checks for it, and its runs on every backend.

The GPU host is this machine through the session's real sshd, logging in as
the unprivileged test user; the tiny models (tests/support/llm_tasks.py) are
made readable to it. What the probe checks before a run copies anything: the
model's directory, whether bitsandbytes loads 4-bit weights there, and the
GPU memory the run needs, which ``gpus: auto`` asks of a GPU (the fake
``nvidia-smi`` stands in for GPUs).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from potato.trainers import hf_llm_finetune
from tests.support.potato_project import make_project
from tests.support.remote_host import assert_host_clean
from tests.support.runs import potato, run_dir_of, store_of

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


@pytest.fixture(scope="module")
def host_llama(tiny_llama):
    """The session's tiny Llama, readable by the ssh user (the trainer loads it on the host)."""
    for path in [Path(tiny_llama), *Path(tiny_llama).rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return tiny_llama


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
