#!/usr/bin/env bash
# Create (or reuse) .venv-potato212 with the real annotation tool, potato-annotation 2.12.1,
# for tests/e2e/test_beside_potato212.py. Its own virtualenv: it installs the same import
# name (`potato`) and console script (`potato`) as this project, so one environment cannot
# hold both (docs/beside-potato-2.12.md). Safe to run again: a stamp skips the install.
# About 20 s and 470 MB (pandas, scikit-learn, scipy; no torch).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec bash scripts/install-own-venv.sh "${POTATO212_VENV:-.venv-potato212}" "potato-annotation==2.12.1" \
    install-potato212.sh
