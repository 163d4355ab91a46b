"""Many projects, one Prefect: two Potato projects on the session's Prefect API train at the same time.

Both projects have the same ``annotation_task_name``; each still gets its own
concurrency limit and its own ``project:`` tag, and neither waits for the other.
"""

from __future__ import annotations

import pytest

from potato.config import load_config
from potato.runs.prefect_runs import limit_name, project_key_of
from tests.support.runs import (
    potato, potato_background, processes_matching, store_of, tiny_project, wait_for, wait_for_state,
)

pytestmark = [pytest.mark.prefect, pytest.mark.training]


def _training(store) -> bool:
    run = store.get_run(1) if store.list_runs() else None
    return run is not None and run.state == "running" and any(
        e.kind == "progress" and (e.data.get("step") or 0) > 0 for e in store.events(1))


def _flow_runs_tagged(tag: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag])))


def _limit(name: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(name)


def test_two_projects_on_one_prefect_train_at_the_same_time(prefect_api, tmp_path):
    configs = [tiny_project(tmp_path / name, grace_seconds=5, trainer={"epochs": 100000}) for name in ("a", "b")]
    projects = [load_config(c) for c in configs]
    keys = [project_key_of(p) for p in projects]
    limits = [limit_name(p) for p in projects]
    assert keys[0] != keys[1] and all(k.startswith("review-sentiment-") for k in keys)
    assert limits == [f"potato-training-{k}" for k in keys]

    stores = [store_of(c) for c in configs]
    clis = [potato_background("training", "run", str(c), log=c.parent / "cli.log") for c in configs]
    try:
        # Both train at once: neither project's run waits for the other's.
        wait_for(lambda: all(_training(s) for s in stores), 180, "both projects' runs to train at the same time")
        for name in limits:  # each holds its own project's one slot
            limit = _limit(name)
            assert (limit.limit, limit.active_slots) == (1, 1), name
        for config in configs:
            assert potato("training", "cancel", str(config), "1").returncode == 0
        ended = [wait_for_state(s, 1, ("cancelled", "failed", "succeeded"), timeout=60) for s in stores]
    finally:
        for cli in clis:
            cli.wait(timeout=60)
    assert [r.state for r in ended] == ["cancelled", "cancelled"]
    a, b = ended
    assert a.started_at < b.finished_at and b.started_at < a.finished_at

    for key, run in zip(keys, ended):  # a Prefect user tells them apart by tag
        tagged = _flow_runs_tagged(f"project:{key}")
        assert [str(f.id) for f in tagged] == [run.prefect_flow_run_id]
        assert {"potato", "backend:local", "trainer:hf-text-classification"} <= set(tagged[0].tags)
    assert wait_for(lambda: all(_limit(n).active_slots == 0 for n in limits), 30, "both slots to be free")
    assert processes_matching(str(tmp_path)) == []
