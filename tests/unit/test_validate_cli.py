"""`potato validate CONFIG [--strict] [--json]`: output and exit status, via CliRunner and the real script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from potato.cli import main
from tests.unit.test_config import SEED_CONFIG, write_project

LONG = SEED_CONFIG.replace('"04:00:00"', '"12:00:00"')
LONG_TIME = ("model_training.backends.cluster.time is 12:00:00. A job that holds a GPU for more than "
             "6 hours is long on a shared cluster; check its policy")
ACK = '\nvalidation:\n  acknowledge:\n    - "model_training.backends.cluster.time is"\n'


def invoke(*args):
    return CliRunner().invoke(main, ["validate", *map(str, args)])


def test_seed_config_is_valid(tmp_path):
    path = write_project(tmp_path)
    result = invoke(path, "--strict")
    assert result.exit_code == 0, result.output
    assert result.output == f"{path}: valid (0 errors, 0 warnings, 0 acknowledged)\n"


def test_long_time_warns_and_fails_only_under_strict(tmp_path):
    path = write_project(tmp_path, LONG)
    result = invoke(path)
    assert result.exit_code == 0
    assert result.output == (f"warning: {LONG_TIME}\n"
                             f"{path}: valid (0 errors, 1 warning, 0 acknowledged)\n")
    result = invoke(path, "--strict")
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == f"{path}: fails --strict (0 errors, 1 warning, 0 acknowledged)"


def test_acknowledged_warning_passes_strict(tmp_path):
    path = write_project(tmp_path, LONG + ACK)
    result = invoke(path, "--strict")
    assert result.exit_code == 0, result.output
    assert result.output == (
        f"acknowledged: {LONG_TIME} (by 'model_training.backends.cluster.time is')\n"
        f"{path}: valid (0 errors, 0 warnings, 1 acknowledged)\n")


def test_short_acknowledge_entry_fails_strict(tmp_path):
    path = write_project(tmp_path, LONG + '\nvalidation:\n  acknowledge: ["time is"]\n')
    result = invoke(path, "--strict")
    assert result.exit_code == 1
    assert "warning: validation.acknowledge[0] is 'time is' (7 characters)" in result.output


def test_errors_exit_1(tmp_path):
    path = write_project(tmp_path, SEED_CONFIG.replace("python: /opt/conda/bin/python3\n      gpus",
                                                       "pyhton: /opt/conda/bin/python3\n      gpus"))
    result = invoke(path)
    assert result.exit_code == 1
    assert result.output.startswith(
        "error: model_training.backends.gpu-server.pyhton is not a key of an ssh backend; "
        "did you mean `python`?")
    assert result.output.splitlines()[-1] == f"{path}: invalid (1 error, 0 warnings, 0 acknowledged)"


def test_json_output_is_only_json(tmp_path):
    path = write_project(tmp_path, LONG + ACK)
    result = invoke(path, "--json", "--strict")
    assert result.exit_code == 0
    assert json.loads(result.output) == {
        "ok": True,
        "errors": [],
        "warnings": [],
        "acknowledged": [{"path": "model_training.backends.cluster.time", "message": LONG_TIME,
                          "acknowledged_by": "model_training.backends.cluster.time is"}],
    }


def test_json_for_missing_file(tmp_path):
    result = invoke(tmp_path / "nope.yaml", "--json")
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["ok"] is False and report["errors"][0]["path"] == ""
    assert report["errors"][0]["message"].endswith("does not exist; check the path")


def _potato_script() -> str:
    script = Path(sys.executable).parent / "potato"
    found = str(script) if script.exists() else shutil.which("potato")
    if not found:
        pytest.skip("the potato console script is not installed (pip install -e .)")
    return found


@pytest.mark.parametrize("text, args, status", [
    (SEED_CONFIG, [], 0),
    (LONG, [], 0),
    (LONG, ["--strict"], 1),
    (LONG + ACK, ["--strict"], 0),
    (SEED_CONFIG.replace("backend: gpu-server ", "backend: gpu-servr "), [], 1),
])
def test_console_script_exit_status(tmp_path, text, args, status):
    path = write_project(tmp_path, text)
    proc = subprocess.run([_potato_script(), "validate", str(path), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == status, proc.stdout + proc.stderr


def test_an_item_id_utf8_cannot_encode_is_an_error_naming_file_and_line(tmp_path):
    path = write_project(tmp_path)
    (tmp_path / "data" / "reviews.json").write_text('{"id": "r1", "text": "Great!"}\n{"id": "\\ud83d", "text": "?"}\n')
    result = invoke(path)
    assert result.exit_code == 1
    assert result.output == (
        "error: data/reviews.json line 2: item id '\\ud83d' holds a lone surrogate (an escape such as \\ud83d without "
        "its pair), which UTF-8 cannot encode; change the id in the data file\n"
        f"{path}: invalid (1 error, 0 warnings, 0 acknowledged)\n")
