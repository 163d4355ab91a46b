"""What a remote host has: run there as ``python3 - REMOTE_DIR CODE_HASH PACKAGES_JSON [gpus|no-gpus]`` (this file on stdin).

One round trip answers the connect, pick-GPU and sync-code steps' questions:
the interpreter's version, whether this version of Potato's code is there and
``remote_dir`` can be written, which training packages are missing, what
``nvidia-smi`` reports and which GPU architectures the host's torch has
kernels for. Prints one JSON object. ``no-gpus`` (a SLURM login node, whose
jobs get GPUs from the scheduler, or ``gpus: none``) leaves ``nvidia-smi``
alone: a hung driver there must not hold up a run that needs no answer from it.

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

NVIDIA_SMI_QUERY = "index,name,memory.total,memory.used,memory.free,utilization.gpu,pci.bus_id,compute_cap"
TRAINING_PACKAGES = ("torch", "transformers", "peft")
# A healthy nvidia-smi answers in well under a second (a few seconds on a host of many GPUs
# without persistence mode); past this the driver is hung and would hang the run.
NVIDIA_SMI_TIMEOUT_S = 30
# A SLURM login node must have the first three; scontrol is used where it exists.
SLURM_COMMANDS = ("sbatch", "squeue", "scancel", "scontrol")


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
                "arch_list": list(torch.cuda.get_arch_list())}
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


def probe(remote_dir, code_hash, packages, gpus=True):
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
    return report


def main(argv):
    remote_dir = argv[1] if len(argv) > 1 else "~/.cache/potato-training"
    code_hash = argv[2] if len(argv) > 2 else ""
    packages = json.loads(argv[3]) if len(argv) > 3 else list(TRAINING_PACKAGES)
    gpus = argv[4] != "no-gpus" if len(argv) > 4 else True
    print(json.dumps(probe(remote_dir, code_hash, packages, gpus)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
