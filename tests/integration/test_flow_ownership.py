"""The training flow under a real Prefect API: which runs a flow run may touch, and when its own run starts.

A flow run given ``run_id=N`` of a run another flow run executes (a Prefect
"Custom run", a second ``prefect deployment run``) changes nothing and fails,
naming the owner. A run a flow creates itself (a deployment run, a schedule)
stays ``queued`` while it waits for the project's Prefect slot or for
another run, and is ``running``, its wall clock started, only once it holds
both. No training: the flow's run here is decision-calibrate with nothing to
calibrate, which fails at its first step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from potato.config import load_config
from potato.runs.paths import open_store, run_paths
from potato.runs.prefect_api import ensure_concurrency_limit
from potato.runs.prefect_runs import limit_name
from potato.runs.queue import create_run
from tests.support.potato_project import make_project
from tests.support.runs import stop_group, wait_for, wait_for_state

pytestmark = [pytest.mark.prefect]

REPO = Path(__file__).resolve().parents[2]
OWNER = "3f1c2b7a-0000-4000-8000-000000000001"


def _flow(**parameters) -> subprocess.Popen:
    """The flow in a process of its own, as a Prefect worker runs it."""
    script = f"from flows.training_run import training_run; training_run(**{parameters!r})"
    return subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ))


def test_a_flow_run_given_a_run_another_flow_run_executes_changes_nothing_and_fails(prefect_api, tmp_path):
    config = make_project(tmp_path, n_items=6)
    cfg = load_config(config)
    store = open_store(cfg)
    run = create_run(cfg, store)
    store.transition(run.id, "running", from_states="queued")
    store.update_run(run.id, prefect_flow_run_id=OWNER, flow_pid=os.getpid(), step="training: step 3 of 40")
    before, events = store.get_run(run.id), store.events(run.id)

    flow = _flow(config=str(config), run_id=run.id)
    output = flow.communicate(timeout=120)[0].decode()
    assert flow.returncode != 0
    assert (f"NotThisFlowRun: Run 1 belongs to flow run {OWNER} (run-1 in the Prefect UI); this flow run (") in output
    assert store.get_run(run.id) == before and store.events(run.id) == events  # the page's Prefect link too
    assert sorted(p.name for p in run_paths(cfg, run.id).dir.iterdir()) == []  # not even a flow.log


def test_a_run_its_own_flow_created_is_queued_until_it_holds_the_projects_turn(prefect_api, tmp_path):
    from prefect.concurrency.sync import concurrency

    config = make_project(tmp_path, n_items=6)
    cfg = load_config(config)
    store = open_store(cfg)
    other = create_run(cfg, store)
    limit = limit_name(cfg)
    ensure_concurrency_limit(limit, 1)
    flow = None
    try:
        with concurrency(limit, occupy=1, strict=True, lease_duration=60):  # another flow holds the slot
            flow = _flow(config=str(config), backend="local", trainer="decision-calibrate")
            waiting = wait_for(lambda: len(store.list_runs()) == 2 and store.get_run(2), 120,
                               "the flow to create its run")
            time.sleep(2)  # it must still be waiting for the slot, not running
            waiting = store.get_run(2)
            assert (waiting.state, waiting.step, waiting.started_at) == (
                "queued", "waiting for this project's turn", None)
            assert waiting.prefect_flow_run_id and waiting.flow_pid == flow.pid
            store.transition(other.id, "running", from_states="queued")  # and then Potato's dispatcher started one
        waiting = wait_for(lambda: (r := store.get_run(2)).step == "waiting for run 1 to finish" and r, 30,
                           "the flow to say which run it waits for")
        assert waiting.state == "queued" and [r.id for r in store.active_runs()] == [other.id]
        store.transition(other.id, "failed", from_states="running", error="stopped by the test")
        ended_other = time.time()
        done = wait_for_state(store, 2, ("succeeded", "failed", "cancelled"), timeout=120)
        flow.wait(timeout=60)
    finally:
        if flow is not None:
            stop_group(flow, 10)
    assert done.error.startswith("decision-calibrate needs a succeeded training run of sentiment to calibrate")
    assert done.started_at >= ended_other - 1  # its wall clock started once it held the turn
