#!/usr/bin/env bash
# Create (or reuse) .venv-potato212 with the real annotation tool, potato-annotation 2.12.1,
# for tests/e2e/test_beside_potato212.py. Its own virtualenv: it installs the same import
# name (`potato`) and console script (`potato`) as this project, so one environment cannot
# hold both (README, "Beside Potato 2.12"). Safe to run again: a stamp skips the install.
# About 20 s and 470 MB (pandas, scikit-learn, scipy; no torch).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version="2.12.1"
venv="${POTATO212_VENV:-.venv-potato212}"
stamp="$venv/.potato-annotation-$version"
[[ -f "$stamp" ]] && exit 0
[[ -x "$venv/bin/python" ]] || "${PYTHON:-python3}" -m venv "$venv"
started=$SECONDS
# This machine's pip config names local index dirs that may not exist; drop that warning.
"$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q "potato-annotation==$version" 2>&1 \
    | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
(( PIPESTATUS[0] == 0 ))
touch "$stamp"
echo "[install-potato212.sh] installed potato-annotation==$version into $venv in $((SECONDS - started)) s"
