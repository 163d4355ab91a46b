#!/usr/bin/env bash
# Create (or reuse) .venv-mlflow with a real MLflow tracking server, for tests/integration/test_trackers.py:
# the annotation server reports runs to it over its REST API, and the tests read them back with MLflow's
# own client. Its own virtualenv: MLflow pins much (pandas, SQLAlchemy, …) that Potato needs none of.
# Safe to run again: a stamp skips the install. About 45 s and 850 MB the first time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec bash scripts/install-own-venv.sh "${MLFLOW_VENV:-.venv-mlflow}" "mlflow==3.17.2" install-mlflow.sh
