"""Every temporary file Potato writes, and every file it replaces, goes through here: one home for the rule.

A file replaced "atomically" is written under a temporary name beside it
and renamed over it. In a directory another account can write (a watched
``data_directory`` that a data provider fills, shared storage on a cluster)
that temporary name is a way in: a symlink planted at a name the writer can
guess turns ``open(tmp, "w")`` into a write to any file the writer may
write, a ``chmod``/``chown`` of the path into handing that file to someone
else (``authorized_keys`` included, for a server running as root), and the
rename into a link put where the data file was. So, here and only here:

1. **Created exclusively, never through a link, under a name nobody can
   guess.** ``O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC``, mode 0600, the
   name ending in ``secrets.token_hex`` (a taken name is tried again under
   a new one), relative to the directory's own descriptor (``dir_fd``), so
   that a directory swapped for a link while the file is written does not
   redirect it either.
2. **Mode and owner through the descriptor** (``fchmod``, ``fchown``), never
   through the path.
3. **Renamed only over the file that was read.** ``expect`` is the ``lstat``
   of the destination when it was read: the rename happens only while the
   name still holds that regular file (same device, inode, size and
   modification time), else ``ChangedMeanwhile``. Without ``expect`` (a file
   of Potato's own), whatever stands at the name is replaced: a rename
   replaces a link, it never writes through one.
4. **Durable.** The file is fsynced before the rename and the directory
   after it, so a crash leaves the old file or the new one.

A temporary left by a writer killed half-way has a name that says so
(``.<name>.tmp-<hex>.tmp``; the caller may choose another prefix) and is
removed by whoever owns that directory's clean-up (``remove_leftovers``).

Scratch files that are never renamed into place come from here too
(``scratch_file``, ``anonymous_file``), created under rule 1. A directory
of one's own made by ``tempfile.mkdtemp`` (0700, exclusively) needs none of
this: nobody else can put anything in it.

Part of the remote half (the worker, the agent and the server all write
through it): Python 3.8, standard library only. tests/unit/test_atomic_files.py
lists every writer of temporary files in ``potato/`` and ``flows/`` and fails
on one that bypasses this module.
"""

import io
import os
import re
import secrets
import stat
import tempfile
from contextlib import contextmanager
from typing import IO, BinaryIO, Iterator, Optional, Pattern, Tuple, Union

from potato.training.escaping import ENCODE_ERRORS

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
CREATE_FLAGS = os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
# A taken name (someone planted a file or a link there) is tried again under a new one this many times.
NAME_TRIES = 5
TOKEN_BYTES = 8  # 16 hex digits: 64 bits nobody can guess
NAME_MAX = 255
SUFFIX = ".tmp"

Directory = Union[str, "os.PathLike[str]", int]


class ChangedMeanwhile(Exception):
    """Raised when the destination is no longer the regular file that was read: it was not replaced."""


def fingerprint(st: os.stat_result) -> Tuple[int, int, int, int]:
    """What must not change between reading a file and replacing it: device, inode, size, modification time."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def open_directory(path: "Union[str, os.PathLike[str]]") -> int:
    """A descriptor of directory *path* (the caller closes it); the rest of a write works relative to it."""
    return os.open(path, os.O_RDONLY | _DIRECTORY | _CLOEXEC)


def temporary_prefix(name: str, tag: str = "tmp") -> str:
    """``.<name>.<tag>-``: a hidden name saying whose temporary it is, cut so that the whole stays a file name."""
    room = NAME_MAX - len(".." + tag + "-" + SUFFIX) - 2 * TOKEN_BYTES
    stem = name.encode("utf-8", ENCODE_ERRORS)[:room].decode("utf-8", "ignore")
    return ".{}.{}-".format(stem, tag)


def leftover_pattern(tag: str = "tmp") -> Pattern[str]:
    """The names of the temporaries ``temporary_prefix(…, tag)`` begins (and of those an earlier version
    named with its process id in place of the random part), for ``remove_leftovers``."""
    return re.compile(r"^\..*\.{}-(?:[0-9a-f]{{{}}}|\d+){}$".format(re.escape(tag), 2 * TOKEN_BYTES, re.escape(SUFFIX)))


def _create(dir_fd: int, prefix: str, suffix: str = SUFFIX, flags: int = os.O_WRONLY) -> Tuple[int, str]:
    """Create a new file ``prefix + <hex> + suffix`` (mode 0600) in *dir_fd* under rule 1; its descriptor and name."""
    for attempt in range(NAME_TRIES):
        name = prefix + secrets.token_hex(TOKEN_BYTES) + suffix
        try:
            return os.open(name, flags | CREATE_FLAGS, 0o600, dir_fd=dir_fd), name
        except FileExistsError:
            if attempt + 1 == NAME_TRIES:
                raise
    raise AssertionError("unreachable")


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


class Replacement:
    """A new version of ``directory/name``, written under a temporary name beside it (module docstring).

    ``write`` it (or ``file``), then ``commit``; ``discard`` (or leaving the
    ``with`` block by an exception) removes the temporary. The descriptor
    stays open after ``commit`` until ``close``, for a caller that adds to
    the file once it is in place.

    *mode* and *owner* (``(uid, gid)``) are set through the descriptor;
    *expect* is the destination's ``lstat`` as it was read (rule 3);
    *prefix* the temporary's name before its random part.
    """

    def __init__(self, directory: Directory, name: str, *, mode: int = 0o600,
                 owner: Optional[Tuple[int, int]] = None, expect: Optional[os.stat_result] = None,
                 prefix: Optional[str] = None):
        if "/" in name or name in ("", ".", ".."):
            raise ValueError("{!r} is not a file name".format(name))
        self.name = name
        self.expect = expect
        self._own_dir = not isinstance(directory, int)
        self.dir_fd = open_directory(directory) if self._own_dir else directory  # type: ignore[arg-type]
        self.committed = False
        try:
            fd, self.temporary = _create(self.dir_fd, prefix if prefix is not None else temporary_prefix(name))
        except BaseException:
            self._close_dir()
            raise
        try:
            os.fchmod(fd, mode)
            if owner is not None:
                now = os.fstat(fd)
                if (now.st_uid, now.st_gid) != tuple(owner):
                    os.fchown(fd, owner[0], owner[1])
            self.file = os.fdopen(fd, "wb")  # type: BinaryIO
        except BaseException:
            os.close(fd)
            _unlink_quietly(self.temporary, self.dir_fd)
            self._close_dir()
            raise

    def fileno(self) -> int:
        return self.file.fileno()

    def write(self, data: bytes) -> int:
        return self.file.write(data)

    def commit(self) -> None:
        """fsync, check the destination (rule 3), rename into place, fsync the directory."""
        self.file.flush()
        os.fsync(self.file.fileno())
        if self.expect is not None:
            try:
                now = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise ChangedMeanwhile("{} is gone".format(self.name)) from None
            if not stat.S_ISREG(now.st_mode) or fingerprint(now) != fingerprint(self.expect):
                raise ChangedMeanwhile("{} changed while it was rewritten".format(self.name))
        os.replace(self.temporary, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        self.committed = True
        os.fsync(self.dir_fd)

    def sync(self) -> None:
        """fsync what was written after ``commit``."""
        self.file.flush()
        os.fsync(self.file.fileno())

    def discard(self) -> None:
        if not self.committed:
            _unlink_quietly(self.temporary, self.dir_fd)

    def close(self) -> None:
        try:
            if not self.file.closed:
                self.file.close()
        finally:
            self.discard()
            self._close_dir()

    def _close_dir(self) -> None:
        if self._own_dir and self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    def __enter__(self) -> "Replacement":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.close()


def _split(path: "Union[str, os.PathLike[str]]") -> Tuple[str, str]:
    directory, name = os.path.split(os.fspath(path))
    return directory or ".", name


@contextmanager
def replacing(path: "Union[str, os.PathLike[str]]", *, mode: int = 0o600,
              prefix: Optional[str] = None) -> Iterator[BinaryIO]:
    """A binary file to write in place of *path*: in place, whole, at the end of the ``with`` block."""
    directory, name = _split(path)
    with Replacement(directory, name, mode=mode, prefix=prefix) as new:
        yield new.file
        new.commit()


@contextmanager
def replacing_text(path: "Union[str, os.PathLike[str]]", *, mode: int = 0o600) -> Iterator[IO[str]]:
    """``replacing`` as UTF-8 text (a string UTF-8 cannot encode is written escaped, ``potato.training.escaping``)."""
    with replacing(path, mode=mode) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", errors=ENCODE_ERRORS, newline="")
        try:
            yield text
            text.flush()
        finally:
            text.detach()


def write_bytes(path: "Union[str, os.PathLike[str]]", data: bytes, *, mode: int = 0o600) -> None:
    """Replace *path* by a file holding *data* (module docstring)."""
    with replacing(path, mode=mode) as out:
        out.write(data)


def write_text(path: "Union[str, os.PathLike[str]]", text: str, *, mode: int = 0o600) -> None:
    """Replace *path* by a file holding *text* in UTF-8 (escaped where UTF-8 cannot encode it)."""
    write_bytes(path, text.encode("utf-8", ENCODE_ERRORS), mode=mode)


def scratch_file(directory: "Union[str, os.PathLike[str]]", prefix: str = "", suffix: str = "") -> Tuple[int, str]:
    """A new empty file for scratch use in *directory* (``tempfile.mkstemp``'s shape: a descriptor open for
    reading and writing, and its path); the caller removes it."""
    dir_fd = open_directory(directory)
    try:
        fd, name = _create(dir_fd, prefix, suffix, flags=os.O_RDWR)
    finally:
        os.close(dir_fd)
    return fd, os.path.join(os.fspath(directory), name)


def anonymous_file(directory: "Optional[Union[str, os.PathLike[str]]]" = None) -> BinaryIO:
    """A scratch file with no name (``tempfile.TemporaryFile``): made in *directory* (default the system's
    temporary directory) under rule 1 and removed at once; it goes when it is closed."""
    where = os.fspath(directory) if directory is not None else tempfile.gettempdir()
    dir_fd = open_directory(where)
    try:
        fd, name = _create(dir_fd, ".anonymous-", flags=os.O_RDWR)
        os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return os.fdopen(fd, "w+b")


def remove_leftovers(directory: Directory, pattern: Pattern[str]) -> list:
    """Remove the temporaries matching *pattern* that a killed writer left in *directory* (regular files
    only: a link of that name is someone else's, and left); the names removed."""
    own = not isinstance(directory, int)
    dir_fd = open_directory(directory) if own else directory  # type: ignore[arg-type]
    removed = []
    try:
        for name in os.listdir(dir_fd):
            if not pattern.match(name):
                continue
            try:
                if stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=dir_fd)
                    removed.append(name)
            except OSError:
                pass
    finally:
        if own:
            os.close(dir_fd)
    return removed
