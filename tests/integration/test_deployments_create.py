"""``python -m deployments.create`` against a real Prefect API: the work pool's limit, and the configs allow-list.

No worker and no training: the work pool is read back from the API, and
the flow's refusal of a config outside the allow-list happens before it
reads anything.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from deployments import create
from potato.runs import prefect_runs
from tests.support.potato_project import make_project

pytestmark = [pytest.mark.prefect]


def _pool(limit: int | None, description: str | None = None) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    name = f"pool-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=name, type="process", concurrency_limit=limit,
                                               description=description))
    return name


def _read(name: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_work_pool(name)


def test_a_limit_the_operator_set_on_the_work_pool_stays_and_only_an_older_potatos_is_lifted(prefect_api):
    operators = _pool(3)
    assert create.ensure_work_pool(operators) == (
        f"Work pool {operators!r} keeps the concurrency limit 3 set on it: at most 3 flow run(s) at once across "
        "every project on it (each project's own limit of one still holds)")
    assert _read(operators).concurrency_limit == 3
    described = _pool(1, "the lab's GPU queue")
    create.ensure_work_pool(described)
    assert _read(described).concurrency_limit == 1

    older = _pool(1)  # what Potato before this version made: limit 1, no description
    assert create.ensure_work_pool(older) == (
        f"Lifted the concurrency limit 1 that an older Potato gave work pool {older!r}: each project's flows hold "
        "their own limit")
    assert (_read(older).concurrency_limit, _read(older).description) == (None, create.POOL_DESCRIPTION)
    new = f"pool-{uuid.uuid4().hex[:8]}"
    assert create.ensure_work_pool(new) is None
    assert (_read(new).concurrency_limit, _read(new).description) == (None, create.POOL_DESCRIPTION)


def test_a_flow_run_naming_a_config_outside_the_allow_list_is_refused_before_it_is_read(
        prefect_api, tmp_path, monkeypatch):
    from flows.training_run import training_run

    monkeypatch.setattr(prefect_runs, "ALLOW_LIST", tmp_path / "allowed-configs.json")
    allowed = make_project(tmp_path / "reviews", n_items=4)
    assert create.update_allow_list([str(allowed)], None) == [str(allowed.resolve())]
    secret = tmp_path / "not-a-config.yaml"
    secret.write_text("password: hunter2\n")
    umask = os.umask(0o077)
    try:
        state = training_run(config=str(secret), backend="local", return_state=True)
    finally:
        # The flow sets its process's umask to 077 (what a run writes is private), here pytest's: the tests
        # after this one that plant files for the ssh host's user would find them unreadable.
        os.umask(umask)
    assert state.is_failed()
    message = (f"The config {str(secret)!r} is not one this Prefect deployment trains ({tmp_path}/allowed-configs.json "
               f"allows {str(allowed.resolve())!r}); nothing was read. If it should be, add it on the worker's "
               f"host: python -m deployments.create --allow-config {str(secret)!r}")
    assert message in state.message and "hunter2" not in state.message
    with pytest.raises(create.SetupError, match=r"^--allow-config '/nowhere.yaml': no such file"):
        create.update_allow_list(["/nowhere.yaml"], None)
    # Once there is an allow-list, a project deployment adds its config.
    other = make_project(tmp_path / "topics", n_items=4)
    assert create.update_allow_list([], str(other)) == [str(allowed.resolve()), str(other.resolve())]


def test_without_an_allow_list_any_config_is_accepted(tmp_path, monkeypatch):
    monkeypatch.setattr(prefect_runs, "ALLOW_LIST", tmp_path / "absent.json")
    prefect_runs.check_allowed_config(str(Path("/any/config.yaml")))
    assert create.update_allow_list([], str(tmp_path / "config.yaml")) is None


def test_the_command_says_which_configs_flow_runs_may_train(prefect_api, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(prefect_runs, "ALLOW_LIST", tmp_path / "allowed-configs.json")
    monkeypatch.setattr(create, "deploy", lambda argv: None)  # prefect deploy itself: test_deployment.py
    config = make_project(tmp_path / "reviews", n_items=4)
    assert create.main(["--allow-config", str(config)]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == [
        f"Flow runs may train these configs ({tmp_path}/allowed-configs.json): {config.resolve()}",
        "Deployment training-run/potato is on work pool 'potato-training'"]
