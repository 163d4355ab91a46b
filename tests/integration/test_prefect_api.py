"""The embedded Prefect API against a real server: reuse, flows, no orphans, leaked slots."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from potato.runs.prefect_api import (
    LIMIT_NAME,
    _lease_ids_for,
    build_server_argv,
    build_server_env,
    embedded_prefect,
    ensure_concurrency_limit,
    is_healthy,
    read_state,
    release_leaked_slots,
    start_embedded,
    ui_url_for,
)

pytestmark = pytest.mark.prefect

# A child Python gets these seconds to import Prefect and reach the API; a
# server start gets the module's own deadline plus this.
CHILD_DEADLINE_S = 60


def _env_without_api_url() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)
    return env


def _read_line(process: subprocess.Popen, deadline_s: float) -> str:
    """Return the child's next stdout line, failing the test after *deadline_s*."""
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    if not selector.select(timeout=deadline_s):
        process.kill()
        pytest.fail(f"child printed nothing within {deadline_s} s; stderr: "
                    f"{process.stderr.read() if process.stderr else ''}")
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=10)
        pytest.fail(f"child exited ({process.returncode}) early: {process.stderr.read()}")
    return line.strip()


def _process_group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait_until(predicate, deadline_s: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def test_pure_builders():
    assert build_server_argv(4321, python="/py") == [
        "/py", "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", "4321"]
    env = build_server_env(Path("/x/prefect"), "http://127.0.0.1:4321/api",
                           base={"PREFECT_API_URL": "http://elsewhere/api", "PATH": "/bin"})
    assert env["PREFECT_HOME"] == "/x/prefect"
    # The UI is told where its API is: `--port` alone leaves it calling 127.0.0.1:4200.
    assert env["PREFECT_SERVER_UI_API_URL"] == "http://127.0.0.1:4321/api"
    assert "PREFECT_API_URL" not in env and env["PATH"] == "/bin"
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false" and env["DO_NOT_TRACK"] == "1"
    assert env["PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE"].endswith("lease_storage.filesystem")


@pytest.mark.parametrize("api, environ, ui", [
    ("http://127.0.0.1:4321/api", {}, "http://127.0.0.1:4321"),
    ("http://prefect.lab:4200/api/", {}, "http://prefect.lab:4200"),
    ("http://127.0.0.1:4321/api", {"PREFECT_UI_URL": "https://prefect.lab.example.org/"},
     "https://prefect.lab.example.org"),
    (None, {}, None),
])
def test_ui_url_for_an_api(api, environ, ui):
    assert ui_url_for(api, environ) == ui


def test_a_set_prefect_api_url_is_used_and_nothing_started(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    server = start_embedded(tmp_path / "training")
    assert (server.url, server.owned, server.pid) == ("http://127.0.0.1:9/api", False, None)
    server.stop()
    with embedded_prefect(tmp_path / "training") as url:
        assert url == "http://127.0.0.1:9/api"
    assert os.environ["PREFECT_API_URL"] == "http://127.0.0.1:9/api"
    assert not (tmp_path / "training").exists()


def test_fixture_sets_api_url_and_state_file(prefect_api):
    assert os.environ["PREFECT_API_URL"] == prefect_api.url
    assert is_healthy(prefect_api.url)
    if prefect_api.home is not None:  # the embedded server's UI asks /ui-settings where its API is
        with urllib.request.urlopen(prefect_api.url[: -len("/api")] + "/ui-settings", timeout=10) as answer:
            assert json.loads(answer.read())["api_url"] == prefect_api.url
    if prefect_api.home is None:
        pytest.skip("external PREFECT_API_URL: no state file")
    state = read_state(prefect_api.home)
    assert state["url"] == prefect_api.url and state["pid"] == prefect_api.server.pid
    print(f"prefect_api fixture start: {prefect_api.start_seconds:.1f} s")


def test_second_process_reuses_the_server(prefect_api):
    if prefect_api.training_dir is None:
        pytest.skip("external PREFECT_API_URL")
    script = textwrap.dedent("""
        import json, sys, time
        t = time.monotonic()
        from potato.runs.prefect_api import start_embedded
        s = start_embedded(sys.argv[1], set_env=False)
        print(json.dumps({"url": s.url, "pid": s.pid, "owned": s.owned,
                          "seconds": time.monotonic() - t}))
        s.stop()  # a no-op for a reused server
    """)
    result = subprocess.run(
        [sys.executable, "-c", script, str(prefect_api.training_dir)],
        env=_env_without_api_url(), capture_output=True, text=True, timeout=CHILD_DEADLINE_S,
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["url"] == prefect_api.url
    assert answer["pid"] == prefect_api.server.pid
    assert answer["owned"] is False
    assert answer["seconds"] < 3, answer
    # The reusing process's stop() left the server running.
    assert is_healthy(prefect_api.url)


def test_a_trivial_flow_runs_against_it(prefect_api):
    from prefect import flow, task
    from prefect.client.orchestration import get_client

    @task
    def add(a, b):
        return a + b

    @flow(name="potato-trivial")
    def trivial(x: int):
        return add(x, 1)

    times = []
    for _ in range(2):
        started = time.monotonic()
        state = trivial(1, return_state=True)
        times.append(time.monotonic() - started)
        assert state.result() == 2
    with get_client(sync_client=True) as client:
        assert str(client.api_url).rstrip("/") == prefect_api.url.rstrip("/")
        run = client.read_flow_run(state.state_details.flow_run_id)
        assert run.state.is_completed()
    print(f"trivial flow: first {times[0]:.2f} s, then {times[1]:.2f} s")


def test_two_starters_share_one_server_and_sigterm_leaves_no_orphan(tmp_path):
    """Two processes start at once on a project with a stale api.json: one server, no orphan."""
    training_dir = tmp_path / "training"
    home = training_dir / "prefect"
    home.mkdir(parents=True)
    # A stale state file (a dead pid, nothing listening) must be replaced.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    (home / "api.json").write_text(json.dumps(
        {"url": "http://127.0.0.1:9/api", "pid": dead.pid, "started_at": 0}))

    script = textwrap.dedent("""
        import json, os, sys, time
        from potato.runs.prefect_api import embedded_prefect, install_sigterm_exit, prefect_home, read_state
        install_sigterm_exit()
        with embedded_prefect(sys.argv[1]) as url:
            assert os.environ["PREFECT_API_URL"] == url
            server_pid = read_state(prefect_home(sys.argv[1]))["pid"]
            # The starter is the server's parent (field 4 of /proc/PID/stat).
            stat = open(f"/proc/{server_pid}/stat").read().rsplit(")", 1)[1].split()
            owned = int(stat[1]) == os.getpid()
            print(json.dumps({"url": url, "server_pid": server_pid, "owned": owned}), flush=True)
            time.sleep(600)
    """)
    starters = [
        subprocess.Popen([sys.executable, "-c", script, str(training_dir)],
                         env=_env_without_api_url(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    server_pid = None
    try:
        answers = [json.loads(_read_line(p, CHILD_DEADLINE_S + 90)) for p in starters]
        server_pid = answers[0]["server_pid"]
        assert answers[0]["url"] == answers[1]["url"]
        assert answers[1]["server_pid"] == server_pid != dead.pid
        assert sorted(a["owned"] for a in answers) == [False, True]
        assert read_state(home)["pid"] == server_pid
        url = answers[0]["url"]
        assert is_healthy(url)

        user = starters[[a["owned"] for a in answers].index(False)]
        user.send_signal(signal.SIGTERM)
        assert user.wait(timeout=30) == 0
        assert is_healthy(url)  # a process that reused the server leaves it running

        owner = starters[[a["owned"] for a in answers].index(True)]
        owner.send_signal(signal.SIGTERM)
        assert owner.wait(timeout=30) == 0
        assert _wait_until(lambda: _process_group_gone(server_pid), 15), (
            f"server group {server_pid} outlived its owner")
        assert not is_healthy(url, timeout=1)
        assert read_state(home) is None  # removed by the owner's stop()
    finally:
        for process in starters:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        if server_pid is not None:
            try:
                os.killpg(server_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_slot_of_a_killed_holder_is_released(prefect_api):
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency

    ensure_concurrency_limit(LIMIT_NAME, 1)

    script = textwrap.dedent(f"""
        import time
        from prefect.concurrency.sync import concurrency
        with concurrency({LIMIT_NAME!r}, occupy=1, strict=True, lease_duration=60):
            print("held", flush=True)
            time.sleep(600)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert _read_line(holder, CHILD_DEADLINE_S) == "held"
    finally:
        holder.kill()  # SIGKILL: no finally, no release
        holder.wait(timeout=10)

    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(LIMIT_NAME)
    assert limit.active_slots == 1  # leaked
    if prefect_api.home is not None:
        assert _lease_ids_for(prefect_api.home, str(limit.id))

    # No home given: the embedded server this process uses is found by its URL.
    assert release_leaked_slots(LIMIT_NAME) == 1

    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name(LIMIT_NAME).active_slots == 0
    if prefect_api.home is not None:
        # The leaked lease is revoked, so the lease reaper cannot later free
        # the slot out from under the next holder.
        assert _lease_ids_for(prefect_api.home, str(limit.id)) == []

    started = time.monotonic()
    with concurrency(LIMIT_NAME, occupy=1, strict=True, lease_duration=60,
                     timeout_seconds=20):
        acquired = time.monotonic() - started
    assert acquired < 5, acquired
    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name(LIMIT_NAME).active_slots == 0
    print(f"slot acquired {acquired:.2f} s after release_leaked_slots")
