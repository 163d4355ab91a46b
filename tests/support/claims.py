"""A claimed job as the server sends it (docs/agent-protocol.md, "Claim a job"), for the agent's tests."""

from __future__ import annotations

from typing import Any

PREFIX = "/training/agent/v1"


def make_claim(run_id: Any = 7, **changes: Any) -> dict:
    claim = {
        "run_id": run_id, "backend": "lab", "trainer": "hf-text-classification", "schemas": ["sentiment"],
        "options": {}, "grace_seconds": 2, "heartbeat_timeout_s": 120, "max_predictions_mb": 512,
        "bundle_url": f"{PREFIX}/runs/{run_id}/bundle.tar.gz", "bundle_bytes": 0, "bundle_sha256": None,
        "urls": {k: f"{PREFIX}/runs/{run_id}{tail}" for k, tail in
                 (("status", ""), ("events", "/events"), ("predictions", "/predictions"), ("result", "/result"))},
        "job": {"run_id": run_id, "trainer": "hf-text-classification", "schemas": ["sentiment"], "bundle": "bundle",
                "options": {}, "device": "cpu", "include_unlabeled": True, "grace_seconds": 2},
    }
    claim.update(changes)
    return claim
