"""Every temporary file goes through potato/training/atomic_files.py, and that module holds its rule.

The scan reads the source of potato/ and flows/ (the syntax tree, not the
text) for what writes a temporary file or moves one into place: ``os.replace``,
``os.rename``, a path's ``.rename``/``.replace``, ``shutil.move``, ``tempfile``'s
files, ``write_text``/``write_bytes`` to a temporary, and a hand-made
temporary name (``".tmp"``, ``"tmp-"``). Each is a defect unless it is in the
helper or listed in ``ALLOWED`` with the reason it writes no temporary file.

The helper's own tests plant what an attacker with write access to the
directory would: a link at the temporary's name (made guessable here, the
worst case), a destination swapped for a link, the directory itself swapped
for a link mid-write.
"""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HELPER = "potato/training/atomic_files.py"
TEMPFILE_FILES = {"mkstemp", "mktemp", "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"}
TEMPORARY_NAME = ("tmp-", ".tmp")

# (file, the flagged line as written, stripped) -> why it writes no temporary file of its own.
ALLOWED = {
    ("potato/training/parts.py", "os.replace(os.path.join(source, name), target)"):
        "moves a finished part's model files into the job's artifacts/ (the job's own directory); nothing is written",
    ("potato/bundle/pack.py", 'if f.endswith(".tmp"):'):
        "the bundle packer leaves temporaries out of the bundle; it writes none",
    ("potato/backends/ssh/fetch.py", "partial.rename(ctx.artifacts_dir)"):
        "renames the run's own artifacts.partial/ directory (made 0700 here) once every file has arrived",
    ("potato/backends/ssh/steps.py", 'tmp = f"{env_dir}.tmp-{secrets.token_hex(4)}"'):
        "a directory name in a command run on the ssh host, in remote_dir (that account's own)",
    ("potato/backends/ssh/steps.py", 'tmp = shlex.quote(f"{remote_dir}/code/.tmp-{code_hash}-{secrets.token_hex(4)}")'):
        "a directory name in a command run on the ssh host, in remote_dir (that account's own)",
}


def _source_files() -> list[Path]:
    return [p for package in ("potato", "flows") for p in sorted((ROOT / package).rglob("*.py"))]


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def temporary_writers(path: Path) -> list[tuple[int, str]]:
    """(line, what) for each place in *path* that writes or moves a temporary file by itself."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    found = []
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "tempfile":
            found += [(node.lineno, f"from tempfile import {a.name}") for a in node.names if a.name in TEMPFILE_FILES]
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            attr = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if name in ("os.replace", "os.rename", "os.renames", "shutil.move"):
                found.append((node.lineno, name))
            elif name.startswith("tempfile.") and attr in TEMPFILE_FILES:
                found.append((node.lineno, name))
            elif attr == "rename" or (attr == "replace" and len(node.args) == 1 and not node.keywords):
                found.append((node.lineno, f"a path's .{attr}()"))  # str.replace takes two arguments
            elif attr in ("write_text", "write_bytes") and "tmp" in ast.unparse(node.func.value).lower():
                found.append((node.lineno, f".{attr}() to a temporary"))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and any(t in node.value for t in TEMPORARY_NAME)):
            found.append((node.lineno, f"a temporary's name {node.value!r}"))
    lines = source.splitlines()
    return sorted({(line, lines[line - 1].strip()) for line, _ in found})


def test_every_temporary_file_is_written_through_the_one_helper():
    bypassing = []
    allowed_seen = set()
    for path in _source_files():
        relative = path.relative_to(ROOT).as_posix()
        if relative == HELPER:
            continue
        for line, text in temporary_writers(path):
            if (relative, text) in ALLOWED:
                allowed_seen.add((relative, text))
            else:
                bypassing.append(f"{relative}:{line}: {text}")
    assert bypassing == [], ("these write or move temporary files without potato/training/atomic_files.py "
                             "(use it, or add the line to ALLOWED with the reason it writes no temporary file)")
    assert sorted(set(ALLOWED) - allowed_seen) == []  # no stale entry


def test_the_scan_finds_each_kind_of_writer(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os, shutil, tempfile\nfrom tempfile import mkstemp\n"
        "os.replace(a, b)\npath.rename(other)\nnew.replace(old)\ntext.replace('a', 'b')\n"
        "shutil.move(a, b)\ntempfile.NamedTemporaryFile()\ntmp.write_text('x')\nname = f'.{x}.tmp'\n"
        "tempfile.mkdtemp()\n")
    assert [line for line, _ in temporary_writers(sample)] == [2, 3, 4, 5, 7, 8, 9, 10]


# -- the rule ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def atomic_files():
    from potato.training import atomic_files

    return atomic_files


@pytest.fixture
def guessable_names(monkeypatch, atomic_files):
    """The random part of the next temporary's name is known (the worst case: an attacker guessed it)."""
    names = iter(["0" * 16] + [f"{n:016x}" for n in range(1, 100)])
    monkeypatch.setattr(atomic_files.secrets, "token_hex", lambda n: next(names))
    return ".data.jsonl.tmp-" + "0" * 16 + ".tmp"


def test_a_link_planted_at_the_temporary_name_is_never_followed(tmp_path, guessable_names, atomic_files):
    victim = tmp_path / "victim"
    victim.write_bytes(b"the victim's own bytes\n")
    victim.chmod(0o640)
    before = (victim.read_bytes(), os.stat(victim))
    directory = tmp_path / "shared"
    directory.mkdir()
    (directory / "data.jsonl").write_bytes(b"old\n")
    (directory / guessable_names).symlink_to(victim)

    atomic_files.write_bytes(directory / "data.jsonl", b"new\n", mode=0o644)

    after = os.stat(victim)
    assert victim.read_bytes() == before[0]
    assert (after.st_mode, after.st_uid, after.st_gid) == (before[1].st_mode, before[1].st_uid, before[1].st_gid)
    assert (directory / "data.jsonl").read_bytes() == b"new\n"
    assert stat.S_IMODE(os.lstat(directory / "data.jsonl").st_mode) == 0o644
    assert os.path.islink(directory / guessable_names)  # left where it was, someone else's


def test_a_destination_that_is_no_longer_the_file_read_is_not_replaced(tmp_path, atomic_files):
    directory = tmp_path / "shared"
    directory.mkdir()
    data = directory / "data.jsonl"
    data.write_bytes(b"old\n")
    read = os.lstat(data)
    victim = tmp_path / "victim"
    victim.write_bytes(b"victim\n")
    with atomic_files.Replacement(directory, "data.jsonl", expect=read) as new:
        new.write(b"new\n")
        data.unlink()
        data.symlink_to(victim)  # swapped for a link while the new version was written
        with pytest.raises(atomic_files.ChangedMeanwhile):
            new.commit()
    assert victim.read_bytes() == b"victim\n" and os.path.islink(data)
    assert sorted(p.name for p in directory.iterdir()) == ["data.jsonl"]  # no temporary left


def test_a_directory_swapped_for_a_link_mid_write_does_not_redirect_it(tmp_path, atomic_files):
    directory = tmp_path / "shared"
    directory.mkdir()
    (directory / "data.jsonl").write_bytes(b"old\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data.jsonl").write_bytes(b"someone else's\n")
    with atomic_files.Replacement(directory, "data.jsonl") as new:
        new.write(b"new\n")
        directory.rename(tmp_path / "moved")
        directory.symlink_to(elsewhere)
        new.commit()
    assert (elsewhere / "data.jsonl").read_bytes() == b"someone else's\n"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["data.jsonl"]
    assert (tmp_path / "moved" / "data.jsonl").read_bytes() == b"new\n"


def test_mode_and_owner_are_set_through_the_descriptor_and_leftovers_go(tmp_path, atomic_files):
    directory = tmp_path / "d"
    directory.mkdir()
    with atomic_files.Replacement(directory, "f.json", mode=0o604, owner=(os.getuid(), os.getgid())) as new:
        new.write(b"{}")
        new.commit()
    assert stat.S_IMODE(os.stat(directory / "f.json").st_mode) == 0o604
    killed = directory / (atomic_files.temporary_prefix("f.json") + "ab" * 8 + ".tmp")
    killed.write_bytes(b"half")
    planted = directory / (atomic_files.temporary_prefix("g.json") + "cd" * 8 + ".tmp")
    planted.symlink_to(tmp_path)
    assert atomic_files.remove_leftovers(directory, atomic_files.leftover_pattern()) == [killed.name]
    assert sorted(p.name for p in directory.iterdir()) == sorted(["f.json", planted.name])


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path, atomic_files):
    path = tmp_path / "f.json"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_files.replacing(path) as out:
            out.write(b"half")
            raise RuntimeError("killed")
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"] and path.read_text() == "old"


def test_scratch_and_anonymous_files_are_made_exclusively(tmp_path, guessable_names, atomic_files):
    (tmp_path / ("weights-" + "0" * 16 + ".pt")).symlink_to(tmp_path / "victim")
    fd, path = atomic_files.scratch_file(tmp_path, prefix="weights-", suffix=".pt")
    os.close(fd)
    assert Path(path).name == "weights-" + f"{1:016x}" + ".pt" and not (tmp_path / "victim").exists()
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    with atomic_files.anonymous_file(tmp_path) as scratch:
        scratch.write(b"x")
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([Path(path).name, "weights-" + "0" * 16 + ".pt"])
