"""A real MLflow tracking server on loopback, and MLflow's own client to read back what a run reported.

``scripts/install-mlflow.sh`` (run by ``scripts/test.sh``) puts MLflow in
``.venv-mlflow`` (or ``$MLFLOW_VENV``), its own virtualenv. The
``mlflow_server`` fixture starts ``mlflow server`` there once per session
(an SQLite store and served artifacts in a temporary directory) and yields
its address; it skips the test when MLflow is missing (failing under
``CI=true``). ``read_back`` runs MLflow's ``MlflowClient`` in that
virtualenv and returns what it reads as JSON: the tests never read MLflow's
store themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.support.runs import free_port, stop_group, wait_for

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("MLFLOW_VENV") or REPO / ".venv-mlflow")
START_TIMEOUT_S = 120

_READ = r"""
import json, sys
from mlflow import MlflowClient
uri, experiment, name, download = sys.argv[1:5]
client = MlflowClient(uri)
found = client.get_experiment_by_name(experiment)
runs = client.search_runs([found.experiment_id], filter_string=f"attributes.run_name = '{name}'") if found else []
out = []
for run in runs:
    history = {key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
               for key in run.data.metrics}
    files = []
    def walk(path):
        for f in client.list_artifacts(run.info.run_id, path):
            walk(f.path) if f.is_dir else files.append(f.path)
    walk(None)
    local = client.download_artifacts(run.info.run_id, "", download)
    out.append({"status": run.info.status, "params": run.data.params, "tags": run.data.tags,
                "metrics": run.data.metrics, "history": history, "files": sorted(files), "downloaded": local})
print(json.dumps(out))
"""


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """``mlflow server`` on a free loopback port; yields its URL."""
    command = VENV / "bin" / "mlflow"
    if not command.exists():
        reason = f"MLflow is not installed in {VENV}; run: bash scripts/install-mlflow.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the tracker tests must run)")
        pytest.skip(reason)
    home = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(home / "server.log", "wb")
    process = subprocess.Popen(
        [str(command), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}", "--artifacts-destination", str(home / "art")],
        cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: _answers(url) or process.poll() is not None, START_TIMEOUT_S, "mlflow server to answer")
        if process.poll() is not None:
            pytest.fail(f"mlflow server exited {process.returncode}: {(home / 'server.log').read_text()[-2000:]}")
        yield url
    finally:
        stop_group(process, 10)
        log.close()


def read_back(url: str, experiment: str, run_name: str, download: Path) -> list[dict]:
    """Every MLflow run named *run_name* in *experiment*, as MLflow's own client reads it (its artifacts
    downloaded under *download*)."""
    download.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([str(VENV / "bin" / "python"), "-c", _READ, url, experiment, run_name, str(download)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "MLFLOW_TRACKING_URI": url})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
