"""What a remote host has: run there as ``python3 - REMOTE_DIR CODE_HASH PACKAGES_JSON [gpus|no-gpus [QUESTIONS_JSON]]``
(this file on stdin).

One round trip answers the connect, pick-GPU and sync-code steps' questions:
the interpreter's version, whether this version of Potato's code is there and
``remote_dir`` can be written, which training packages are missing, what
``nvidia-smi`` reports and which GPU architectures the host's torch has
kernels for. Prints one JSON object. ``no-gpus`` (a SLURM login node, whose
jobs get GPUs from the scheduler, or ``gpus: none``) leaves ``nvidia-smi``
alone: a hung driver there must not hold up a run that needs no answer from it.

``QUESTIONS_JSON`` carries what a run's trainers ask of the host (their
``host_questions`` hook, potato/training/trainers/registry.py): ``models``, the
``model`` settings to look up there (a directory, or a hub id in the host's
Hugging Face cache; each answered with its ``config.json``), and
``four_bit``, whether bitsandbytes loads 4-bit weights there
(:func:`four_bit_support`, on the first GPU when torch has CUDA, else on the CPU),
and ``speed``, the GFLOP/s a matrix product reaches on that device (:func:`matmul_gflops`,
for ``potato training check local``'s rough time).

Part of the remote half: Python 3.8, standard library only.
"""

import getpass
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from typing import NamedTuple, Optional

NVIDIA_SMI_QUERY = "index,name,memory.total,memory.used,memory.free,utilization.gpu,pci.bus_id,compute_cap"
TRAINING_PACKAGES = ("torch", "transformers", "peft")
# A healthy nvidia-smi answers in well under a second (a few seconds on a host of many GPUs
# without persistence mode); past this the driver is hung and would hang the run.
NVIDIA_SMI_TIMEOUT_S = 30
# A SLURM login node must have the first three; scontrol is used where it exists.
SLURM_COMMANDS = ("sbatch", "squeue", "scancel", "scontrol")
# A model's config.json is a few KB; anything past this is not one, and is not sent back.
CONFIG_MAX_BYTES = 1 << 20
OFFLINE_VALUES = ("1", "true", "yes", "on")


def _expand(path):
    return os.path.expanduser(path)


def _nvidia_smi():
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"found": False}
    try:
        done = subprocess.run(
            [exe, "--query-gpu=" + NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=NVIDIA_SMI_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"found": True, "status": -1, "stdout": "", "stderr": "", "timed_out": NVIDIA_SMI_TIMEOUT_S}
    except OSError as exc:
        return {"found": True, "status": -1, "stdout": "", "stderr": str(exc)}
    return {
        "found": True,
        "status": done.returncode,
        "stdout": done.stdout.decode("utf-8", "replace"),
        "stderr": done.stderr.decode("utf-8", "replace"),
    }


def _torch_arch_list():
    # Importing torch costs seconds: only asked when there are GPUs to judge.
    try:
        import torch  # noqa: F401
    except Exception as exc:  # any import failure means: no usable torch
        return {"ok": False, "error": "{}: {}".format(type(exc).__name__, exc)}
    try:
        return {"ok": True, "version": torch.__version__, "cuda": torch.version.cuda,
                "arch_list": list(torch.cuda.get_arch_list()), "gpus": torch.cuda.device_count()}
    except Exception as exc:
        return {"ok": False, "error": "{}: {}".format(type(exc).__name__, exc)}


def _writable(path):
    """Whether this account can create what Potato keeps under *path* (it need not exist yet)."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def first_line(exc):
    """``OSError: the first line of the message``: an exception as one line for a user's message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "{}: {}".format(type(exc).__name__, lines[0]) if lines else type(exc).__name__


class FourBitSupport(NamedTuple):
    """Whether bitsandbytes loads 4-bit weights here: ``ok``, its ``version``, and the ``problem`` when not."""

    ok: bool
    version: Optional[str]
    problem: Optional[str]


def four_bit_support(device="cpu"):
    """Import bitsandbytes and quantize a small tensor on ``device`` (``cpu``, ``cuda:0``) with it.

    On CUDA this loads bitsandbytes' compiled kernels, which is where a
    bitsandbytes built for another CUDA version fails; on the CPU it needs
    bitsandbytes 0.49 or later.
    """
    try:
        import bitsandbytes
        import bitsandbytes.functional as bnb_functional
        import torch
    except Exception as exc:  # ImportError, or a broken install failing on import
        return FourBitSupport(False, None, first_line(exc))
    version = str(getattr(bitsandbytes, "__version__", "?"))
    try:
        dtype = torch.float16 if device.startswith("cuda") else torch.float32
        weights = torch.ones((64, 64), dtype=dtype, device=device)
        packed, state = bnb_functional.quantize_4bit(weights, quant_type="nf4")
        bnb_functional.dequantize_4bit(packed, state)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    except Exception as exc:
        return FourBitSupport(False, version, "bitsandbytes {} cannot quantize on {}: {}".format(
            version, device, first_line(exc)))
    return FourBitSupport(True, version, None)


def matmul_gflops(device="cpu", seconds=0.3):
    """The GFLOP/s a square fp32 matrix product (fp16 on CUDA) reaches on ``device`` over about ``seconds``:
    what a rough training time is reckoned from; None when torch cannot say."""
    try:
        import time

        import torch

        n = 1024
        dtype = torch.float16 if device.startswith("cuda") else torch.float32
        a = torch.randn((n, n), dtype=dtype, device=device)
        b = torch.randn((n, n), dtype=dtype, device=device)
        a @ b  # the first product warms up the kernels
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            a @ b
            done += 1
            if device.startswith("cuda"):
                torch.cuda.synchronize()
        return round(2.0 * n ** 3 * done / (time.perf_counter() - start) / 1e9, 1)
    except Exception:  # no torch, no device: no figure
        return None


def hub_offline():
    """Whether this interpreter's Hugging Face libraries may not download (``HF_HUB_OFFLINE``)."""
    return any(os.environ.get(name, "").strip().lower() in OFFLINE_VALUES
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def names_a_path(model):
    """Whether a ``model`` setting that is no directory here names a path (an error) rather than a hub id."""
    expanded = _expand(model)
    return os.path.isabs(expanded) or model.startswith((".", "~")) or os.path.exists(expanded) or model.count("/") > 1


def _hub_cache():
    if os.environ.get("HF_HUB_CACHE"):
        return _expand(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(_expand(os.environ["HF_HOME"]), "hub")
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return os.path.join(_expand(cache), "huggingface", "hub")


def _cached_snapshot(hub_id):
    """The directory of *hub_id*'s cached snapshot with a config.json (main's, else any), or None."""
    repo = os.path.join(_hub_cache(), "models--" + hub_id.replace("/", "--"))
    snapshots = os.path.join(repo, "snapshots")
    try:
        with open(os.path.join(repo, "refs", "main")) as f:
            names = [f.read().strip()]
    except OSError:
        names = []
    try:
        names += sorted(os.listdir(snapshots))
    except OSError:
        return None
    for name in names:
        if name and os.path.isfile(os.path.join(snapshots, name, "config.json")):
            return os.path.join(snapshots, name)
    return None


def _read_config(directory):
    path = os.path.join(directory, "config.json")
    try:
        if os.path.getsize(path) > CONFIG_MAX_BYTES:
            return None, "config.json is larger than {} bytes".format(CONFIG_MAX_BYTES)
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        return None, first_line(exc)
    return (config, None) if isinstance(config, dict) else (None, "config.json is not a JSON object")


def look_up_model(model):
    """Where a trainer's ``model`` setting is on this host: ``{"found": "dir"|"hub-cache"|"no-dir"|"not-cached",
    "dir", "config", "problem", "offline"}``, by the rule the trainers resolve it by (a path that is no
    directory here is an error; any other name is a hub id)."""
    expanded = _expand(model)
    if os.path.isdir(expanded):
        found, where = os.path.abspath(expanded), "dir"
    elif names_a_path(model):
        return {"found": "no-dir"}
    else:
        found, where = _cached_snapshot(model), "hub-cache"
        if found is None:
            return {"found": "not-cached", "offline": hub_offline()}
    config, problem = _read_config(found)
    return {"found": where, "dir": found, "config": config, "problem": problem}


def _four_bit_device(report):
    torch = report.get("torch") or {}
    return "cuda:0" if torch.get("ok") and torch.get("cuda") and torch.get("gpus") else "cpu"


def probe(remote_dir, code_hash, packages, gpus=True, questions=None):
    report = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "version_info": list(sys.version_info[:3]),
        "home": os.path.expanduser("~"),
        "user": getpass.getuser(),
        "code_present": os.path.isfile(os.path.join(_expand(remote_dir), "code", code_hash, "potato", "__init__.py")),
        "remote_dir_writable": _writable(_expand(remote_dir)),
        "missing": [name for name in packages if importlib.util.find_spec(name) is None],
        "nvidia_smi": _nvidia_smi() if gpus else {"found": False, "asked": False},
        "commands": {name: shutil.which(name) for name in SLURM_COMMANDS},
    }
    smi = report["nvidia_smi"]
    if smi.get("found") and smi.get("status") == 0 and smi.get("stdout", "").strip() and "torch" not in report["missing"]:
        report["torch"] = _torch_arch_list()
    questions = questions or {}
    if questions.get("models"):
        report["models"] = {model: look_up_model(model) for model in questions["models"]}
    if questions.get("four_bit"):
        device = _four_bit_device(report)
        report["four_bit"] = dict(four_bit_support(device)._asdict(), device=device)
    if questions.get("speed"):
        device = _four_bit_device(report)
        report["speed"] = {"device": device, "gflops": matmul_gflops(device)}
    return report


def main(argv):
    remote_dir = argv[1] if len(argv) > 1 else "~/.cache/potato-training"
    code_hash = argv[2] if len(argv) > 2 else ""
    packages = json.loads(argv[3]) if len(argv) > 3 else list(TRAINING_PACKAGES)
    gpus = argv[4] != "no-gpus" if len(argv) > 4 else True
    questions = json.loads(argv[5]) if len(argv) > 5 else {}
    print(json.dumps(probe(remote_dir, code_hash, packages, gpus, questions)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
