"""A run's model and its card as one ``.tar.gz``, made while it is sent: no copy of the model on disk.

The same files a publish would send (``potato.publish.plan``), under one
top folder. The archive is written member by member into a gzip stream
(zlib, level 1: model weights barely compress, and the CPU is the server's),
one chunk at a time, so memory stays at a chunk whatever the model's size.
"""

from __future__ import annotations

import tarfile
import time
import zlib
from typing import Iterable, Iterator

from potato.publish.plan import OutFile

CHUNK = 1024 * 1024
BLOCK = tarfile.BLOCKSIZE


class ModelChanged(OSError):
    """Raised when a file's size changed while it was being sent (the stream is then cut short)."""


def archive_name(run_id: int) -> str:
    return f"potato-run-{run_id}-model"


def stream_tar_gz(files: Iterable[OutFile], top: str) -> Iterator[bytes]:
    """The bytes of a ``.tar.gz`` holding *files* under *top*/, a chunk at a time."""
    gzip = zlib.compressobj(1, zlib.DEFLATED, 31)  # wbits 31: the gzip container
    now = int(time.time())

    def packed(data: bytes) -> Iterator[bytes]:
        out = gzip.compress(data)
        if out:
            yield out

    for f in files:
        info = tarfile.TarInfo(f"{top}/{f.path}")
        info.size, info.mode, info.mtime = f.size, 0o644, now
        yield from packed(info.tobuf(format=tarfile.PAX_FORMAT))
        left = f.size
        with f.open() as fh:
            while left:
                data = fh.read(min(CHUNK, left))
                if not data:
                    raise ModelChanged(f"{f.path} is shorter than when the download started")
                left -= len(data)
                yield from packed(data)
        yield from packed(b"\0" * (-f.size % BLOCK))
    yield from packed(b"\0" * (2 * BLOCK))
    tail = gzip.flush()
    if tail:
        yield tail
