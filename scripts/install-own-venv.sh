#!/usr/bin/env bash
# bash scripts/install-own-venv.sh VENV REQUIREMENT NAME: create (or reuse) the virtualenv VENV holding one
# tool the tests run beside this project (REQUIREMENT, e.g. potato-annotation==2.12.1), in its own
# environment because it pins or names what ours cannot share. Safe to run again: a stamp per requirement
# skips the install. NAME is what the closing line says did it.
set -euo pipefail
venv="$1" requirement="$2" name="$3"
stamp="$venv/.installed-${requirement//[^A-Za-z0-9._-]/_}"
[[ -f "$stamp" ]] && exit 0
[[ -x "$venv/bin/python" ]] || "${PYTHON:-python3}" -m venv "$venv"
started=$SECONDS
# This machine's pip config names local index dirs that may not exist; drop that warning.
"$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q "$requirement" 2>&1 \
    | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
(( PIPESTATUS[0] == 0 ))
touch "$stamp"
echo "[$name] installed $requirement into $venv in $((SECONDS - started)) s"
