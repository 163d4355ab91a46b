"""GPU choice for the ssh backend: parse ``nvidia-smi``, pick by free memory.

``gpus: auto`` takes the GPU with the most *free memory* (on a shared server a
card with low utilisation can still be full) — with ``max_gpus: N``, up to N
of them, each with ``min_free_gpu_mb`` free, or with the memory the run's
trainer estimates it needs when that is more — refuses when none has that
much free, skips GPUs the host's torch has no kernels for, and
trains on the CPU on a host with no GPU at all. ``"1"`` / ``"0,1"`` pin;
``none`` trains on the CPU.

nvidia-smi numbers GPUs by PCI bus id; CUDA, by default, fastest first. The
worker is started with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that the indices
chosen here mean the same GPUs to CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from potato.errors import BackendError, NoFreeGpu, NoKernels, ParseError
from potato.training.device import has_kernels as device_has_kernels

FIELDS = ("index", "name", "memory.total", "memory.used", "memory.free", "utilization.gpu", "pci.bus_id", "compute_cap")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_total_mb: int
    memory_used_mb: int
    memory_free_mb: int
    utilization_pct: int | None
    pci_bus_id: str
    compute_cap: tuple[int, int] | None
    has_kernels: bool = True

    def describe(self) -> str:
        util = f"{self.utilization_pct}% busy" if self.utilization_pct is not None else "utilisation unknown"
        text = f"GPU {self.index}: {self.name}, {self.memory_free_mb} of {self.memory_total_mb} MB free, {util}"
        if not self.has_kernels:
            text += " (torch there has no kernels for it)"
        return text


@dataclass(frozen=True)
class GpuChoice:
    indices: tuple[int, ...]  # empty: train on the CPU
    reason: str
    min_free_mb: int = 0  # what auto asked of each GPU: min_free_gpu_mb,
    needed_mb: int | None = None  # or the trainer's estimate when that was more (None: it was not)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(i) for i in self.indices)

    def describe(self, gpus: Sequence[Gpu]) -> str:
        if not self.indices:
            return f"the CPU ({self.reason})"
        by_index = {g.index: g for g in gpus}
        names = [f"GPU {i} ({by_index[i].name})" if i in by_index else f"GPU {i}" for i in self.indices]
        return ", ".join(names) + f" ({self.reason})"


def _number(text: str) -> int | None:
    text = text.strip()
    if text in ("[N/A]", "N/A", "[Not Supported]", ""):
        return None
    return int(float(text))


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """GPUs from ``nvidia-smi --query-gpu=<FIELDS> --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(FIELDS):
            raise ParseError("nvidia-smi", line)
        row = dict(zip(FIELDS, cells))
        try:
            cap = row["compute_cap"]
            major, _, minor = cap.partition(".")
            gpus.append(Gpu(
                index=int(row["index"]),
                name=row["name"],
                memory_total_mb=_number(row["memory.total"]) or 0,
                memory_used_mb=_number(row["memory.used"]) or 0,
                memory_free_mb=_number(row["memory.free"]) or 0,
                utilization_pct=_number(row["utilization.gpu"]),
                pci_bus_id=row["pci.bus_id"],
                compute_cap=(int(major), int(minor or 0)) if major.isdigit() else None,
            ))
        except ValueError as exc:
            raise ParseError("nvidia-smi", line) from exc
    return gpus


def has_kernels(capability: tuple[int, int] | None, arch_list: Sequence[str]) -> bool:
    """True when torch built for *arch_list* can run on a GPU of *capability*.

    The worker's own rule (``potato.training.device.has_kernels``: ``sm_XY``
    runs on the same major version at or above minor Y, ``compute_XY`` PTX on
    anything at or above X.Y), so the server and the GPU host never disagree.
    """
    if capability is None:
        return True  # nothing to judge by: let the worker find out
    return device_has_kernels(capability, arch_list)


def mark_kernels(gpus: Sequence[Gpu], torch: dict | None) -> list[Gpu]:
    """Mark which GPUs the host's torch can run on, from the probe's ``torch`` report.

    A torch built without CUDA (``torch.version.cuda`` is None — a CPU wheel on
    a GPU server) has kernels for none of them. Without a report (torch not
    importable there), nothing is judged: the trainer check says what is missing.
    """
    from dataclasses import replace

    if not torch or not torch.get("ok"):
        return list(gpus)
    if not torch.get("cuda"):
        return [replace(g, has_kernels=False) for g in gpus]
    arch_list = torch.get("arch_list") or []
    return [replace(g, has_kernels=has_kernels(g.compute_cap, arch_list)) for g in gpus]


def choose_for_backend(gpus: Sequence[Gpu], backend: Any, *, needed_mb: int | None = None,
                       needed_by: str = "") -> GpuChoice:
    """:func:`choose_gpus` with an ssh backend's ``gpus``, ``min_free_gpu_mb`` and ``max_gpus``."""
    return choose_gpus(gpus, backend.get("gpus", "auto"), int(backend.get("min_free_gpu_mb", 2000)),
                       int(backend.get("max_gpus", 1)), needed_mb=needed_mb, needed_by=needed_by)


def choose_gpus(gpus: Sequence[Gpu], setting: str, min_free_mb: int, max_gpus: int = 1, *,
                needed_mb: int | None = None, needed_by: str = "") -> GpuChoice:
    """Apply the backend's ``gpus`` setting to the host's GPUs; raise when a run must not start.

    ``auto`` takes the GPU with the most free memory, or with ``max_gpus`` > 1
    up to that many of those with ``min_free_gpu_mb`` free, most free first
    (a run with several GPUs trains data-parallel on all of them). *needed_mb*,
    the GPU memory the run's trainer estimates one process needs (*needed_by*
    says whose estimate), takes the place of ``min_free_gpu_mb`` when it is more.
    """
    setting = str(setting).strip().lower() if setting is not None else "auto"
    if setting == "none":
        return GpuChoice((), "gpus: none")
    if setting != "auto":
        wanted = tuple(int(part) for part in setting.split(","))
        known = {g.index for g in gpus}
        missing = [i for i in wanted if i not in known]
        if missing:
            raise BackendError(
                f"gpus: {setting!r} names GPU {', '.join(map(str, missing))}, but the host has "
                + (f"GPUs {', '.join(str(g.index) for g in gpus)}" if gpus else "no GPU")
            )
        return GpuChoice(wanted, f"pinned by gpus: {setting!r}")
    if not gpus:
        return GpuChoice((), "the host has no GPU")
    usable = [g for g in gpus if g.has_kernels]
    if not usable:
        raise NoKernels()
    estimate = needed_mb if needed_mb is not None and needed_mb > min_free_mb else None
    wanted_mb = estimate if estimate is not None else min_free_mb
    ranked = sorted(usable, key=lambda g: (-g.memory_free_mb, g.index))
    taken = [g for g in ranked[:max(1, max_gpus)] if g.memory_free_mb >= wanted_mb]
    if not taken:
        raise NoFreeGpu(wanted_mb, needed_by if estimate is not None else "")
    free = ", ".join(str(g.memory_free_mb) for g in taken)
    return GpuChoice(tuple(g.index for g in taken), f"most free memory: {free} MB", min_free_mb, estimate)
