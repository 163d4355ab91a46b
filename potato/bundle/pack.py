"""A bundle directory packed into a ``.tar.gz`` byte for byte reproducibly, and its manifest read back."""

from __future__ import annotations

import gzip
import json
import os
import tarfile
from pathlib import Path
from typing import Any

from potato.training import atomic_files

# A fixed timestamp (2020-01-01) so the same bundle always packs to the same bytes.
_PACK_MTIME = 1577836800


def _bundle_members(bundle_dir: Path) -> list[Path]:
    members = []
    for root, dirs, files in os.walk(bundle_dir):
        dirs.sort()
        rel_root = Path(root).relative_to(bundle_dir)
        for d in dirs:
            members.append(rel_root / d)
        for f in sorted(files):
            if f.endswith(".tmp"):
                continue
            members.append(rel_root / f)
    return sorted(members, key=lambda p: p.as_posix())


def pack_bundle(bundle_dir: str | Path, dest_tar_gz: str | Path, *, compresslevel: int = 1) -> Path:
    """Pack *bundle_dir* into *dest_tar_gz*, byte-for-byte reproducibly.

    Members are relative to the bundle directory, sorted by path, with a fixed
    mtime, owner 0/0 and modes 0644/0755; the gzip header has no name and a
    fixed mtime. Level 1 compression: bundles are mostly text and speed matters
    more than the last 10 %. Written to a temp file and renamed.
    """
    src = Path(bundle_dir)
    dest = Path(dest_tar_gz)
    # A name of its own per call: the flow and an agent's claim may pack the same bundle at once.
    with atomic_files.replacing(dest) as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=compresslevel, mtime=_PACK_MTIME) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for rel in _bundle_members(src):
                    path = src / rel
                    info = tarfile.TarInfo(rel.as_posix())
                    info.mtime = _PACK_MTIME
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    if path.is_dir():
                        info.type = tarfile.DIRTYPE
                        info.mode = 0o755
                        tar.addfile(info)
                    else:
                        info.mode = 0o644
                        info.size = path.stat().st_size
                        with open(path, "rb") as fh:
                            tar.addfile(info, fh)
    return dest


def read_manifest(bundle_dir: str | Path) -> dict[str, Any]:
    """The bundle's ``manifest.json`` as a dict."""
    return json.loads((Path(bundle_dir) / "manifest.json").read_text(encoding="utf-8"))
