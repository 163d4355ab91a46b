"""The remote half as one archive, named by the hash of its content ("sync code by hash").

What a GPU host needs of Potato is ``potato/__init__.py`` and ``potato/training/``
(the worker, the agent, the kinds of answer and, in ``training/trainers/``, the
trainers: the remote half, stdlib only at import, Python ≥ 3.8; docs/architecture.md, "Layers"). The hash
covers their paths and bytes, so a host keeps one copy per version and a run
copies nothing when the host already has it.
"""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
from pathlib import Path

from potato.runs.paths import PACKAGE_ROOT

REMOTE_HALF = ("potato/__init__.py", "potato/training")


def remote_half_files(root: Path = PACKAGE_ROOT) -> list[Path]:
    """The files copied to a host, relative to *root*, in a stable order."""
    files = []
    for entry in REMOTE_HALF:
        path = root / entry
        if path.is_file():
            files.append(Path(entry))
        else:
            files += [p.relative_to(root) for p in path.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(files)


@functools.lru_cache(maxsize=4)
def code_archive(root: Path = PACKAGE_ROOT) -> tuple[str, bytes]:
    """(hash, .tar.gz bytes) of the remote half. The archive is deterministic."""
    digest = hashlib.sha256()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for relative in remote_half_files(root):
            data = (root / relative).read_bytes()
            digest.update(str(relative).encode() + b"\0" + data + b"\0")
            info = tarfile.TarInfo(str(relative))
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return digest.hexdigest()[:16], buffer.getvalue()
