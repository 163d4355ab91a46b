"""The fake nvidia-smi (tests/services/nvidia-smi) answers like the real tool.

Runs it as a plain subprocess (no ssh): these pin its output format, which
the ssh backend's parser tests and integration tests rely on.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

FAKE = Path(__file__).resolve().parents[1] / "services" / "nvidia-smi"

A100 = {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920,
        "memory_used": 1024, "memory_free": 80896, "utilization_gpu": 3,
        "pci_bus_id": "00000000:07:00.0", "compute_cap": "8.0",
        "uuid": "GPU-8fe3a97d-51f6-a669-0d80-b4530b81b816"}
T4 = {"index": 1, "name": "Tesla T4", "memory_total": 15360, "memory_used": 15000,
      "memory_free": 360, "utilization_gpu": 97, "pci_bus_id": "00000000:08:00.0",
      "compute_cap": "7.5"}


def fake(tmp_path, gpus, *args):
    gpus_file = tmp_path / "gpus.json"
    if gpus is not None:
        gpus_file.write_text(json.dumps(gpus))
    return subprocess.run([sys.executable, str(FAKE), *args], capture_output=True, text=True,
                          timeout=30, env={"FAKE_NVIDIA_SMI_GPUS": str(gpus_file),
                                           "HOME": str(tmp_path)})


@pytest.mark.parametrize("args, stdout", [
    (["--query-gpu=index,name,memory.total,memory.used,memory.free,utilization.gpu",
      "--format=csv,noheader,nounits"],
     "0, NVIDIA A100-SXM4-80GB, 81920, 1024, 80896, 3\n1, Tesla T4, 15360, 15000, 360, 97\n"),
    # Fields come back in the order asked for.
    (["--query-gpu=memory.free,index", "--format=csv,noheader,nounits"], "80896, 0\n360, 1\n"),
    (["--query-gpu=pci.bus_id,compute_cap", "--format=csv,noheader,nounits"],
     "00000000:07:00.0, 8.0\n00000000:08:00.0, 7.5\n"),
    (["--query-gpu=index,memory.used,utilization.gpu", "--format=csv"],
     "index, memory.used [MiB], utilization.gpu [%]\n0, 1024 MiB, 3 %\n1, 15000 MiB, 97 %\n"),
    (["--query-gpu=index,memory.used", "--format=csv,nounits"],
     "index, memory.used\n0, 1024\n1, 15000\n"),
])
def test_query_output(tmp_path, args, stdout):
    result = fake(tmp_path, [T4, A100], *args)
    assert (result.returncode, result.stdout, result.stderr) == (0, stdout, "")


def test_uuid_given_or_stable(tmp_path):
    args = ["--query-gpu=uuid", "--format=csv,noheader,nounits"]
    first = fake(tmp_path, [A100, T4], *args).stdout.splitlines()
    assert first[0] == "GPU-8fe3a97d-51f6-a669-0d80-b4530b81b816"
    assert first[1].startswith("GPU-") and len(first[1]) == len(first[0])
    assert fake(tmp_path, [A100, T4], *args).stdout.splitlines() == first


def test_unknown_field_is_the_real_error(tmp_path):
    result = fake(tmp_path, [A100], "--query-gpu=index,memory.bogus", "--format=csv")
    assert (result.returncode, result.stdout) == (
        2, 'Field "memory.bogus" is not a valid field to query.\n\n')


@pytest.mark.parametrize("gpus", [[], None], ids=["empty list", "no file"])
def test_no_gpus(tmp_path, gpus):
    result = fake(tmp_path, gpus, "--query-gpu=index", "--format=csv,noheader,nounits")
    assert (result.returncode, result.stdout) == (6, "No devices were found\n")
