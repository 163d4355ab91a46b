"""The abuse report against a live ``potato start`` (hostile clients, annotators, data providers): every row says yes.

Runs bench/abuse_report.py as a user would (its own process, its own
project, the real ``potato start``), with the session's Prefect API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.prefect]


def test_every_abuse_case_is_refused_and_costs_nothing(prefect_api):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "abuse_report.py"), "--json"], cwd=ROOT,
                          env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr
    rows = json.loads(done.stdout)
    failed = [row for row in rows if not row["ok"]]
    assert failed == [], json.dumps(failed, indent=2)
    assert len(rows) == 28 and done.returncode == 0
