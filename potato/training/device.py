"""Which torch device a run trains on, and how to name it.

``auto`` takes the first CUDA GPU that the installed torch has kernels for,
then Apple Metal (``mps``), then the CPU. ``gpu`` (what Potato 2.12 configs
say) chooses as ``auto`` does but expects a GPU: training on the CPU then
carries a warning. ``cuda:1`` (or ``cuda``, ``mps``, ``cpu``) asks for one
device; when it does not exist here the run falls back to another accelerator
or the CPU, and the choice carries a warning that the worker writes to the
run log.

torch is imported inside the functions: importing this module loads only the
standard library. On a machine without torch every choice is the CPU.
"""

from __future__ import annotations

import os
import re
from typing import List, NamedTuple, Optional, Sequence, Tuple

# What sets the BLAS/OpenMP thread counts: num_threads sets them for the worker, before torch loads.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class DeviceChoice(NamedTuple):
    """The device a run uses: ``device`` for torch (``cpu``, ``cuda:0``, ``mps``),
    ``name`` for people (``CUDA 0: NVIDIA A100 (80 GB)``), and ``warning`` when
    the requested device was not available (None otherwise)."""

    device: str
    name: str
    warning: Optional[str]


def has_kernels(capability: Tuple[int, int], arch_list: Sequence[str]) -> bool:
    """Whether a GPU of compute ``capability`` can run a torch built for ``arch_list``.

    ``arch_list`` is ``torch.cuda.get_arch_list()`` (e.g. ``["sm_80", "sm_90",
    "compute_90"]``). Binary kernels (``sm_XY``) run on GPUs of the same major
    version and an equal or higher minor; PTX (``compute_XY``) is compiled at
    load time for any GPU at or above it. An empty list (a build that does not
    say) counts as yes: torch itself decides then.
    """
    if not arch_list:
        return True
    major, minor = capability
    for arch in arch_list:
        m = re.match(r"^(sm|compute)_(\d+?)(\d)[a-z]*$", arch.strip())
        if not m:
            continue
        kind, a_major, a_minor = m.group(1), int(m.group(2)), int(m.group(3))
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _cpu_name(torch, num_threads: Optional[int] = None) -> str:
    if num_threads:
        threads = num_threads
    elif torch is not None:
        threads = torch.get_num_threads()
    else:
        threads = os.cpu_count() or 1
    return "CPU ({} thread{})".format(threads, "" if threads == 1 else "s")


def _cuda_name(torch, index: int) -> str:
    props = torch.cuda.get_device_properties(index)
    gb = int(round(props.total_memory / 1024 ** 3))
    return "CUDA {}: {} ({} GB)".format(index, props.name, gb)


def usable_cuda_indices(torch=None) -> List[int]:
    """Indices of the visible CUDA GPUs that the installed torch has kernels for."""
    torch = torch or _torch()
    if torch is None:
        return []
    try:
        if not torch.cuda.is_available():
            return []
        arch_list = torch.cuda.get_arch_list()
        return [
            i
            for i in range(torch.cuda.device_count())
            if has_kernels(tuple(torch.cuda.get_device_capability(i)), arch_list)
        ]
    except Exception:  # a broken driver reads as no GPU, not as a crash
        return []


def usable_cuda_devices() -> List[Tuple[str, str]]:
    """``(device, name)`` of each visible CUDA GPU the installed torch has kernels for, e.g.
    ``("cuda:0", "CUDA 0: NVIDIA H200 (141 GB)")``: the GPUs a data-parallel run trains on."""
    torch = _torch()
    return [("cuda:{}".format(i), _cuda_name(torch, i)) for i in usable_cuda_indices(torch)]


def _mps_available(torch) -> bool:
    try:
        return bool(torch.backends.mps.is_available())
    except Exception:
        return False


def _auto(torch, num_threads: Optional[int]) -> Tuple[str, str]:
    if torch is not None:
        cuda = usable_cuda_indices(torch)
        if cuda:
            return "cuda:{}".format(cuda[0]), _cuda_name(torch, cuda[0])
        if _mps_available(torch):
            return "mps", "Apple Metal (mps)"
    return "cpu", _cpu_name(torch, num_threads)


def choose_device(setting: Optional[str] = "auto", num_threads: Optional[int] = None) -> DeviceChoice:
    """Pick the device for ``setting`` (``auto``, ``cpu``, ``gpu``, ``cuda``, ``cuda:N``, ``mps``).

    Never raises for a device that is missing here: it falls back as ``auto``
    would and says so in ``warning``.
    """
    device, name, why = _choose(setting, num_threads)
    warning = None
    if why:
        warning = "The requested device {!r} is not available ({}); training on {} instead".format(
            setting, why, name
        )
    return DeviceChoice(device, name, warning)


def _choose(setting: Optional[str], num_threads: Optional[int]) -> Tuple[str, str, Optional[str]]:
    """(device, name, why the requested device was not taken, or None)."""
    torch = _torch()
    wanted = (setting or "auto").strip().lower()
    if wanted == "auto":
        return _auto(torch, num_threads) + (None,)
    if wanted == "cpu":
        return "cpu", _cpu_name(torch, num_threads), None
    if wanted == "gpu":
        device, name = _auto(torch, num_threads)
        return device, name, ("this machine has no GPU torch can use" if device == "cpu" else None)

    why = None  # type: Optional[str]
    m = re.match(r"^cuda(?::(\d+))?$", wanted)
    if m:
        index = int(m.group(1) or 0)
        if torch is None:
            why = "torch is not installed"
        elif not torch.cuda.is_available():
            why = "this machine has no CUDA GPU torch can use"
        elif index >= torch.cuda.device_count():
            why = "this machine has {} CUDA GPU(s)".format(torch.cuda.device_count())
        elif index not in usable_cuda_indices(torch):
            why = "the installed torch has no kernels for it"
        else:
            return "cuda:{}".format(index), _cuda_name(torch, index), None
    elif wanted == "mps":
        if torch is not None and _mps_available(torch):
            return "mps", "Apple Metal (mps)", None
        why = "Apple Metal (mps) is not available here"
    else:
        why = "it is not a device Potato knows (use auto, cpu, gpu, cuda, cuda:N or mps)"

    return _auto(torch, num_threads) + (why,)


def describe_local_device(setting: Optional[str] = "auto", num_threads: Optional[int] = None) -> str:
    """The device a local run would use, for ``potato training check local``.

    E.g. ``CPU (2 threads)``, ``CUDA 0: NVIDIA A100 (80 GB)``, ``Apple Metal
    (mps)``; a fallback is named with its reason, e.g. ``CPU (2 threads)
    (device 'cuda:1' is not available: this machine has no CUDA GPU torch can
    use)``. Imports torch (a few seconds).
    """
    _, name, why = _choose(setting, num_threads)
    if _torch() is None:
        return name + " (torch is not installed)"
    if why:
        return "{} (device {!r} is not available: {})".format(name, setting, why)
    return name
