"""List a directory tree for the server to copy: ``python - DIR < list_files.py`` on a host.

One record per entry that is not a directory, each ``KIND SIZE NAME`` ended
by a NUL byte, so no byte a file name may hold (newlines and tabs included)
can split or forge a record. KIND is ``f`` for a regular file; anything else
(``l`` symlink, ``p`` FIFO, ``c``/``b`` device, ``s`` socket, ``u`` a setuid
or setgid file, ``?`` unreadable or unknown) is listed so the server can name
it in the run log, and is never copied. Symlinks are not followed, so the
listing never leaves DIR. The reading side is ``potato.backends.ssh.steps.parse_listing``;
it trusts nothing here either.

Part of the remote half: Python 3.8, standard library only; sent on standard
input, so it runs whatever version of Potato's code the host has.
"""

import os
import stat
import sys

KINDS = ((stat.S_ISLNK, "l"), (stat.S_ISFIFO, "p"), (stat.S_ISCHR, "c"), (stat.S_ISBLK, "b"),
         (stat.S_ISSOCK, "s"))


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "u" if mode & (stat.S_ISUID | stat.S_ISGID) else "f"
    for test, kind in KINDS:
        if test(mode):
            return kind
    return "?"


def records(root: str, prefix: str = ""):
    """(kind, size, relative name) of every non-directory entry under *root*, symlinks not followed."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        yield "?", 0, prefix.rstrip("/") or "."
        return
    for entry in entries:
        name = prefix + entry.name
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            yield "?", 0, name
            continue
        if stat.S_ISDIR(info.st_mode):
            for record in records(entry.path, name + "/"):
                yield record
        else:
            yield kind_of(info.st_mode), info.st_size, name


def main(root: str) -> int:
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return 0  # the trainer saved nothing
    out = sys.stdout.buffer
    found = records(root) if stat.S_ISDIR(top.st_mode) else [(kind_of(top.st_mode), 0, ".")]
    for kind, size, name in found:
        out.write("{} {} ".format(kind, size).encode("ascii") + os.fsencode(name) + b"\0")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
