"""Names that come from elsewhere become local paths here, and only here.

A remote host's listing of its artifacts, the tar stream it sends them in and
a server's bundle all name files that this machine then creates. None of them
is trusted: a directory named ``x\\n9000000\\t`` once turned one line of a
listing into two records, the second an absolute name, and ``partial / name``
then discarded ``partial`` (a host wrote the server's ``authorized_keys``).

So a name becomes a path only when it is a plain relative path: no absolute
path, no empty, ``.`` or ``..`` component, no control character, valid UTF-8,
within the usual length limits (``name_problem``). Files are created with
``O_CREAT | O_EXCL | O_NOFOLLOW`` (mode 0600) under directories this code
made itself and checked with ``lstat``, and the result is proven inside the
root with ``realpath``, so a symlink planted on the way is never followed.
Only regular files and directories are made: links, FIFOs, devices and
setuid/setgid bits are refused, never recreated (``member_problem``).

Part of the remote half (the agent unpacks its bundle with it): Python 3.8,
standard library only.
"""

import os
import shutil
import stat
import tarfile
from typing import BinaryIO, Callable, Dict, List, Optional, Sequence

MAX_NAME_BYTES = 4096   # PATH_MAX
MAX_PART_BYTES = 255    # NAME_MAX
CHUNK = 1024 * 1024
SETID_BITS = stat.S_ISUID | stat.S_ISGID
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # absent on Windows, where no symlink is made by accident
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafeName(Exception):
    """A name that may not become a path here; the message quotes it and says why."""


def name_problem(name: str) -> Optional[str]:
    """Why *name* may not become a path under a directory, or None when it may."""
    if not name:
        return "it is empty"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "it holds a control character"
    if name.startswith("/"):
        return "it is an absolute path"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not valid UTF-8"
    if size > MAX_NAME_BYTES:
        return "it is longer than {} bytes".format(MAX_NAME_BYTES)
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return "it has an empty, '.' or '..' component"
        if len(part.encode("utf-8")) > MAX_PART_BYTES:
            return "a component is longer than {} bytes".format(MAX_PART_BYTES)
    return None


def kind_problem(mode: int) -> Optional[str]:
    """Why a file of *mode* (``st_mode``) may not be copied here, or None for a plain file or directory."""
    if stat.S_ISLNK(mode):
        return "it is a symbolic link"
    if stat.S_ISFIFO(mode):
        return "it is a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "it is a device"
    if stat.S_ISSOCK(mode):
        return "it is a socket"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return "it is not a regular file"
    if mode & SETID_BITS:
        return "it has the setuid or setgid bit"
    return None


def member_name(member: tarfile.TarInfo) -> str:
    """A tar member's name without the ``./`` that ``tar -C dir -T list`` puts in front."""
    name = member.name
    while name.startswith("./"):
        name = name[2:]
    return name


def member_problem(member: tarfile.TarInfo) -> Optional[str]:
    """Why tar *member* may not be unpacked here, or None."""
    if member.issym() or member.islnk():
        return "it is a link"
    if member.ischr() or member.isblk():
        return "it is a device"
    if member.isfifo():
        return "it is a FIFO"
    if not (member.isreg() or member.isdir()):
        return "it is not a regular file or directory"
    if member.mode & SETID_BITS:
        return "it has the setuid or setgid bit"
    return name_problem(member_name(member))


def make_dirs(root: str, parts: Sequence[str]) -> str:
    """Create (or reuse) directory ``root/parts…``, mode 0700; refuse anything but a real directory on the way."""
    current = root
    for part in parts:
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            pass
        if not stat.S_ISDIR(os.lstat(current).st_mode):
            raise UnsafeName("{!r} is in the way: it is not a directory".format(current))
    _prove_inside(root, current)
    return current


def create_file(root: str, name: str) -> BinaryIO:
    """Open the new regular file *name* under *root* for writing (mode 0600), making its directories."""
    problem = name_problem(name)
    if problem:
        raise UnsafeName("{!r}: {}".format(name, problem))
    parts = name.split("/")
    parent = make_dirs(root, parts[:-1])
    path = os.path.join(parent, parts[-1])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    return os.fdopen(fd, "wb")


def _prove_inside(root: str, path: str) -> None:
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise UnsafeName("{!r} resolves outside {!r}".format(path, root))


def extract_tar(tar: tarfile.TarFile, dest: str, *,
                accept: Optional[Callable[[str, tarfile.TarInfo], Optional[str]]] = None,
                refuse: Optional[Callable[[str, str], None]] = None) -> List[str]:
    """Unpack the regular files and directories of *tar* (streaming mode works) into *dest*.

    A member that ``member_problem`` or *accept(name, member)* objects to is
    handed to *refuse(name, reason)* and skipped; without *refuse*, the first
    one raises ``UnsafeName``. Returns the names of the files written.
    """
    written = []
    for member in tar:
        name = member_name(member)
        problem = member_problem(member) or (accept(name, member) if accept else None)
        if problem:
            if refuse is None:
                raise UnsafeName("{!r}: {}".format(member.name, problem))
            refuse(member.name, problem)
            continue
        try:
            if member.isdir():
                make_dirs(dest, name.split("/"))
                continue
            with create_file(dest, name) as out:
                shutil.copyfileobj(tar.extractfile(member), out, CHUNK)
        except (UnsafeName, FileExistsError) as exc:  # e.g. a file where a directory must go
            if refuse is None:
                raise UnsafeName("{!r}: {}".format(member.name, exc)) from exc
            refuse(member.name, str(exc))
            continue
        written.append(name)
    return written


def expect_files(sizes: Dict[str, int]) -> Callable[[str, tarfile.TarInfo], Optional[str]]:
    """An *accept* for ``extract_tar``: only the regular files named in *sizes*, each once, at its size."""
    left = dict(sizes)

    def accept(name: str, member: tarfile.TarInfo) -> Optional[str]:
        if not member.isreg():
            return "it is not a regular file"
        if name not in left:
            return "it was not asked for"
        if member.size != left.pop(name):
            return "its size changed after it was listed"
        return None

    return accept
