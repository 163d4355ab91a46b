"""Names from a remote host or a server become local paths only through potato/training/safe_paths.py."""

from __future__ import annotations

import io
import os
import stat
import tarfile

import pytest

from potato.backends.ssh.fetch import parse_listing
from potato.training.safe_paths import (
    UnsafeName, create_file, expect_files, extract_tar, make_dirs, member_problem, name_problem,
)


@pytest.mark.parametrize("name, problem", [
    ("model.safetensors", None),
    ("sentiment/tokenizer.json", None),
    ("a b/ünï cödé.txt", None),
    ("", "it is empty"),
    ("/etc/passwd", "it is an absolute path"),
    ("../escape", "it has an empty, '.' or '..' component"),
    ("a/../../escape", "it has an empty, '.' or '..' component"),
    ("a//b", "it has an empty, '.' or '..' component"),
    ("./a", "it has an empty, '.' or '..' component"),
    ("a/", "it has an empty, '.' or '..' component"),
    ("x\n9000000\t/etc/passwd", "it holds a control character"),
    ("bell\x07", "it holds a control character"),
    ("del\x7f", "it holds a control character"),
    ("bad\udcff", "it is not valid UTF-8"),
    ("a" * 256, "a component is longer than 255 bytes"),
    ("a/" * 2100 + "b", "it is longer than 4096 bytes"),
])
def test_name_problem(name, problem):
    assert name_problem(name) == problem


def test_create_file_makes_a_private_regular_file_inside(tmp_path):
    with create_file(str(tmp_path), "deep/er/model.bin") as out:
        out.write(b"weights")
    path = tmp_path / "deep/er/model.bin"
    assert path.read_bytes() == b"weights"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "deep").stat().st_mode) == 0o700


def test_create_file_never_follows_a_planted_symlink(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "dir").symlink_to(outside)           # a directory on the way
    (root / "file").symlink_to(outside / "owned")  # the file itself
    with pytest.raises(UnsafeName, match="is in the way: it is not a directory"):
        create_file(str(root), "dir/owned")
    with pytest.raises(FileExistsError):
        create_file(str(root), "file")
    with pytest.raises(UnsafeName, match="it is an absolute path"):
        create_file(str(root), str(outside / "owned"))
    assert list(outside.iterdir()) == []


def test_make_dirs_proves_the_result_inside_the_root(tmp_path):
    assert make_dirs(str(tmp_path), ["a", "b"]) == str(tmp_path / "a" / "b")
    with pytest.raises(UnsafeName, match="resolves outside"):
        make_dirs(str(tmp_path / "a"), [".."])


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    buffer.seek(0)
    return buffer


def _member(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, linkname
    return info


HOSTILE = [
    (_member("/tmp/absolute"), b"x", "it is an absolute path"),
    (_member("../up"), b"x", "it has an empty, '.' or '..' component"),
    (_member("link", tarfile.SYMTYPE, linkname="/etc"), b"", "it is a link"),
    (_member("hard", tarfile.LNKTYPE, linkname="/etc/passwd"), b"", "it is a link"),
    (_member("dev", tarfile.CHRTYPE), b"", "it is a device"),
    (_member("fifo", tarfile.FIFOTYPE), b"", "it is a FIFO"),
    (_member("suid", mode=0o4755), b"#!/bin/sh\n", "it has the setuid or setgid bit"),
    (_member("line\nbreak"), b"x", "it holds a control character"),
]


@pytest.mark.parametrize("member, data, problem", HOSTILE, ids=[m[0].name for m in HOSTILE])
def test_a_hostile_member_is_refused(tmp_path, member, data, problem):
    assert member_problem(member) == problem
    with tarfile.open(fileobj=_tar((member, data)), mode="r|") as tar:
        with pytest.raises(UnsafeName, match=problem):
            extract_tar(tar, str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_refused_members_are_reported_and_the_rest_unpacked(tmp_path):
    refused = []
    stream = _tar((_member("./sentiment", tarfile.DIRTYPE, 0o755), b""), (_member("./sentiment/config.json"), b"{}"),
                  *[(m, d) for m, d, _ in HOSTILE])
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        written = extract_tar(tar, str(tmp_path), refuse=lambda name, why: refused.append((name, why)))
    assert written == ["sentiment/config.json"]
    assert [why for _, why in refused] == [problem for _, _, problem in HOSTILE]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "sentiment", "sentiment/config.json"]


def test_expect_files_takes_only_what_was_listed_at_its_size(tmp_path):
    refused = []
    stream = _tar((_member("./a.json"), b"{}"), (_member("./b.json"), b"grown!"), (_member("./extra"), b"x"),
                  (_member("./a.json"), b"{}"))
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        extract_tar(tar, str(tmp_path), accept=expect_files({"a.json": 2, "b.json": 2}),
                    refuse=lambda name, why: refused.append((name, why)))
    assert refused == [("./b.json", "its size changed after it was listed"), ("./extra", "it was not asked for"),
                       ("./a.json", "it was not asked for")]
    assert os.listdir(tmp_path) == ["a.json"]


def test_parse_listing_refuses_what_is_not_a_plain_file_with_a_plain_name():
    listing = (b"f 10 sentiment/model.bin\0"
               b"f 3 x\n9000000\t/root/.ssh/authorized_keys\0"   # one record, whatever its bytes
               b"f 1 /etc/passwd\0f 1 ../up\0f 2 bad\xff\0f x nosize\0"
               b"l 0 link\0p 0 fifo\0c 0 tty\0u 5 suid\0? 0 unreadable\0z 0 odd\0"
               b"f 4 cut")                                         # no NUL: the output was cut short
    files, refused = parse_listing(listing)
    assert files == [(10, "sentiment/model.bin")]
    assert refused == [
        ("f 4 cut", "the listing was cut short"),
        ("x\n9000000\t/root/.ssh/authorized_keys", "it holds a control character"),
        ("/etc/passwd", "it is an absolute path"),
        ("../up", "it has an empty, '.' or '..' component"),
        ("bad\\xff", "its name is not valid UTF-8"),
        ("nosize", "the listing gave no size for it"),
        ("link", "it is a symbolic link"), ("fifo", "it is a FIFO"), ("tty", "it is a device"),
        ("suid", "it has the setuid or setgid bit"), ("unreadable", "the host could not read it"),
        ("odd", "the listing did not say what it is"),
    ]
