"""The remote half (what an ssh run copies to its host) runs on Python 3.8 with the stdlib only.

See potato/training/__init__.py for the rule and docs/architecture.md
("Layers") for why. What the remote half is comes from the archive a run
copies (potato/backends/ssh/code.py), so the test and the copy cannot disagree.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from potato.backends.ssh.code import remote_half_files

ROOT = Path(__file__).resolve().parents[2]
REMOTE_FILES = [ROOT / path for path in remote_half_files(ROOT)]


def remote_modules() -> list[str]:
    names = []
    for path in REMOTE_FILES:
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


def test_there_are_remote_modules():
    names = remote_modules()
    assert "potato.training.worker" in names
    assert "potato.training.trainers.hf_text_classification" in names


def test_remote_half_is_valid_python_3_8():
    pytest.importorskip("vermin")
    argv = ["vermin", "-t=3.8-", "--no-tips", "--violations", *map(str, REMOTE_FILES)]
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from vermin import main; sys.argv = %r; sys.exit(main())" % argv],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_importing_the_remote_half_loads_only_the_standard_library():
    script = (
        "import importlib, json, sys\n"
        "before = set(sys.modules)\n"
        "for name in %r:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n" % remote_modules()
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    added = json.loads(result.stdout)
    ours = set(remote_modules()) | {"potato"}
    foreign = [name for name in added if name.split(".")[0] not in sys.stdlib_module_names and name not in ours]
    assert foreign == [], "the remote half imported non-stdlib modules: %s" % foreign


def _python38() -> str | None:
    found = shutil.which("python3.8")
    candidates = ([found] if found else []) + sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    for candidate in candidates:
        try:
            if subprocess.run([candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"],
                              capture_output=True, timeout=30).returncode == 0:
                return candidate
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def test_the_worker_runs_on_a_real_python_3_8(tmp_path):
    """Where a Python 3.8 exists (pyenv here): import everything, run the worker to a clean failure."""
    python = _python38()
    if python is None:
        pytest.skip("no Python 3.8 interpreter on this machine")
    imports = "; ".join("import " + name for name in remote_modules())
    result = subprocess.run([python, "-c", imports], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    (tmp_path / "job.json").write_text(json.dumps({"trainer": "no-such-trainer", "schemas": []}))
    result = subprocess.run([python, "-m", "potato.training.worker", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    done = json.loads(lines[-1])
    assert done["type"] == "done" and done["error"].startswith("Unknown trainer 'no-such-trainer'")
    assert (tmp_path / "exit_code").read_text() == "1\n"
