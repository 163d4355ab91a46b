"""Processes a trainer starts beside the worker, whose memory counts as the worker's.

``model_training.max_ram_mb`` bounds what a run takes of the machine; a
trainer that moves work into a process of its own (ONNX Runtime's session,
potato/training/trainers/onnx_session.py) adds that process here while it runs, and
the worker's memory watchdog counts its resident memory with the worker's.
(A child forked for a few seconds, as the ONNX export's, shares most of its
pages with the worker and is not added.)

Part of the remote half: standard library only.
"""

import threading
from typing import Optional, Set

_pids = set()  # type: Set[int]
_lock = threading.Lock()


def add(pid: int) -> None:
    with _lock:
        _pids.add(pid)


def discard(pid: int) -> None:
    with _lock:
        _pids.discard(pid)


def vm_rss_mb(pid: str = "self") -> Optional[float]:
    """A process's resident memory (VmRSS) in MB, from /proc; None where it cannot be read (gone; no /proc)."""
    try:
        with open("/proc/{}/status".format(pid), encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        pass
    return None


def resident_mb() -> float:
    """The helper processes' resident memory (VmRSS) together, in MB; 0 for one gone or unreadable."""
    with _lock:
        pids = sorted(_pids)
    return sum(vm_rss_mb(str(pid)) or 0.0 for pid in pids)
