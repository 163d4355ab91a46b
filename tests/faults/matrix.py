"""Print the fault matrix from the last run of tests/faults/: ``python -m tests.faults.matrix``.

Each case of the fault suite appends its outcome to
``test-artifacts/faults.jsonl`` (``tests.support.faults.record``). This prints,
for every fault (rows, in ``FAULTS``) and backend type (columns), the newest
outcome: the run's final state, its message word for word and what was left
behind, or why the fault cannot happen on that backend (``CANNOT_HAPPEN``).
A cell with neither is printed as ``NOT RUN`` and the exit status is 1, so a
fault that silently stopped being tested shows.

``--record FILE`` reads another record; ``--markdown`` prints a table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from potato.backend_types.type_registry import BACKEND_TYPES

RECORD = Path(__file__).resolve().parents[2] / "test-artifacts" / "faults.jsonl"
# Every backend type is a column: a type without its fault cases shows NOT RUN, and the matrix fails.
BACKENDS = tuple(BACKEND_TYPES)

FAULTS = (
    "kill -9 the flow during bundle build",
    "kill -9 the flow during code sync",
    "kill -9 the flow during training",
    "kill -9 the flow during predictions upload",
    "kill -9 the flow during artifact copy",
    "kill -9 the worker during training",
    "kill -9 the worker during ONNX Runtime prediction",
    "Cancel run during ONNX Runtime prediction",
    "kill -9 the agent during training",
    "kill -9 the agent during predictions upload",
    "kill -9 potato start during training (restarted)",
    "kill -9 the Prefect worker during training (deployment)",
    "kill -9 the Prefect worker and its flow during training (deployment)",
    "Prefect worker's SIGTERM to the flow's group (cancel in Prefect)",
    "ssh connection cut during training",
    "ssh connection cut during artifact copy",
    "agent link cut 5 times during the bundle download",
    "agent link cut 6 times during the bundle download",
    "agent link black-holed during training",
    "agent posts delayed",
    "SLURM node failure",
    "SLURM preemption (CANCEL partition)",
    "SLURM preemption (REQUEUE partition)",
    "SLURM job requeued by an admin",
    "SLURM time limit",
    "SLURM out of memory",
    "scancel from outside Potato",
    "disk full in the run directory",
    "unwritable remote_dir",
    "nvidia-smi hangs",
    "20 runs at once (API and CLI)",
)

_NO_CODE_SYNC = "no code sync: the worker runs the code installed where it runs"
_NO_UPLOAD = "no upload: the local worker writes its predictions into the run directory itself"
_NO_COPY_LOCAL = "no copy: the local worker saves the model into the run directory itself"
_NO_COPY_AGENT = "no copy: an agent backend's model stays on the agent's machine (artifact_uri)"
_NO_AGENT = "no agent: the flow starts and watches the worker itself"
_NO_SSH = "no ssh connection on this backend"
_AGENT_ONLY = "no agent link: the server reaches this backend (ssh) or runs it itself"
_SLURM_ONLY = "no scheduler on this backend"
_NO_REMOTE_DIR = "no remote_dir on this backend"

CANNOT_HAPPEN: dict[tuple[str, str], str] = {
    ("kill -9 the flow during code sync", "local"): _NO_CODE_SYNC,
    ("kill -9 the flow during code sync", "agent"): _NO_CODE_SYNC,
    ("kill -9 the flow during predictions upload", "local"): _NO_UPLOAD,
    ("kill -9 the flow during artifact copy", "local"): _NO_COPY_LOCAL,
    ("kill -9 the flow during artifact copy", "agent"): _NO_COPY_AGENT,
    ("kill -9 the agent during training", "local"): _NO_AGENT,
    ("kill -9 the agent during predictions upload", "local"): _NO_AGENT,
    ("ssh connection cut during training", "local"): _NO_SSH,
    ("ssh connection cut during training", "agent"): _NO_SSH + " (the agent's own link: the agent rows)",
    ("ssh connection cut during artifact copy", "local"): _NO_SSH,
    ("ssh connection cut during artifact copy", "agent"): _NO_COPY_AGENT,
    **{(fault, backend): _AGENT_ONLY for fault in FAULTS if fault.startswith("agent ")
       for backend in ("local", "ssh", "slurm")},
    **{(fault, backend): _SLURM_ONLY for fault in FAULTS if "SLURM" in fault or "scancel" in fault
       for backend in ("local", "ssh", "agent")},
    ("unwritable remote_dir", "local"): _NO_REMOTE_DIR + " (the run directory: the disk-full row)",
    ("unwritable remote_dir", "agent"): _NO_REMOTE_DIR + " (the agent keeps its jobs under its own --workdir)",
    ("nvidia-smi hangs", "local"): "never asked: a local worker asks torch for the device",
    ("nvidia-smi hangs", "agent"): "never asked: the agent's worker asks torch for the device on its machine",
}


def read_record(path: Path) -> dict[tuple[str, str], dict]:
    """The newest outcome per (fault, backend type)."""
    cells: dict[tuple[str, str], dict] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                entry = json.loads(line)
                if "type" in entry:  # lines without it come from the record's first format
                    cells[(entry["fault"], entry["type"])] = entry
    return cells


def _shorten(message: str | None) -> str:
    """Temporary directories of the test session as <tmp>, so that the matrix reads the same each time."""
    return re.sub(r"/tmp/pytest-of-\w+/pytest-\d+/\w+?\d*/", "<project>/", message or "")


def describe(fault: str, backend: str, cells: dict) -> str:
    entry = cells.get((fault, backend))
    if entry is not None:
        said = f"{entry['state']}" + (f': "{_shorten(entry["message"])}"' if entry["message"] else "")
        note = f"; {entry['note']}" if entry.get("note") else ""
        return f"{said}; leftovers: {entry['leftovers']}{note} ({entry['seconds']:g} s)"
    reason = CANNOT_HAPPEN.get((fault, backend))
    return f"cannot happen: {reason}" if reason else "NOT RUN"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.matrix", description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, default=RECORD)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    cells = read_record(args.record)
    missing = 0
    if args.markdown:
        print("| fault | " + " | ".join(BACKENDS) + " |")
        print("|---|" + "---|" * len(BACKENDS))
    for fault in FAULTS:
        texts = [describe(fault, backend, cells) for backend in BACKENDS]
        missing += texts.count("NOT RUN")
        if args.markdown:
            print(f"| {fault} | " + " | ".join(t.replace("|", "\\|") for t in texts) + " |")
            continue
        print(fault)
        for backend, text in zip(BACKENDS, texts):
            print(f"  {backend:6} {text}")
    total = sum(entry["seconds"] for entry in cells.values())
    print(f"\n{len(cells)} cases recorded ({total:.0f} s); {missing} cell(s) not run", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
