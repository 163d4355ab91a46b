#!/usr/bin/env bash
# The one short GPU session a task may be lent; bench/gpu_check.py says what it runs.
#
#   bash bench/gpu_check.sh --prepare   # here, once: .gpu-check/ (the model, the example project's bundle)
#   bash bench/gpu_check.sh             # on the GPU machine, with .gpu-check carried: under 8 minutes
#   bash bench/gpu_check.sh --dry       # on a CPU (CI runs it): every step, a tiny model, no GPU
#
# PYTHON picks the interpreter: the GPU machine's own python3 (CUDA torch, transformers, peft) by
# default; the project's .venv where there is one and PYTHON is unset.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
exec "$PYTHON" bench/gpu_check.py "$@"
