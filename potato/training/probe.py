"""What a remote host has: run there as ``python3 - REMOTE_DIR CODE_HASH PACKAGES_JSON`` with this file on stdin.

One round trip answers the connect, pick-GPU and sync-code steps' questions:
the interpreter's version, whether this version of Potato's code is there,
which training packages are missing, what ``nvidia-smi`` reports and which GPU
architectures the host's torch has kernels for. Prints one JSON object.

Part of the remote half: Python 3.8, standard library only.
"""

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys

NVIDIA_SMI_QUERY = "index,name,memory.total,memory.used,memory.free,utilization.gpu,pci.bus_id,compute_cap"
TRAINING_PACKAGES = ("torch", "transformers", "peft")
# A SLURM login node must have the first three; scontrol is used where it exists (SPEC §6).
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
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
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


def probe(remote_dir, code_hash, packages):
    report = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "version_info": list(sys.version_info[:3]),
        "home": os.path.expanduser("~"),
        "code_present": os.path.isfile(os.path.join(_expand(remote_dir), "code", code_hash, "potato", "__init__.py")),
        "missing": [name for name in packages if importlib.util.find_spec(name) is None],
        "nvidia_smi": _nvidia_smi(),
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
    print(json.dumps(probe(remote_dir, code_hash, packages)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
