"""A host whose sshd hangs (it takes the TCP connection and never says a word): the connect step's retries are
shown as they happen, and the last message names the port.

The connect task runs in this process under the session's Prefect API, against a real OpenSSH client and a
listener that accepts and stays silent; ssh's ConnectTimeout is cut from 20 s to 2 s and the retry delays to
0 s (the step still says the delays a run waits), so the three attempts take seconds.
"""

from __future__ import annotations

import socket

import pytest

pytestmark = [pytest.mark.prefect]


@pytest.fixture
def silent_port():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # connections are accepted by the kernel and never answered
        yield listener.getsockname()[1]


def test_a_hung_hosts_retries_are_shown_and_the_last_message_names_the_port(prefect_api, tmp_path, silent_port,
                                                                               monkeypatch):
    from prefect import flow

    from flows.training_run import connect_task
    from potato.backends.base import RunContext, steps_of
    from potato.backends.ssh import openssh
    from potato.config import load_config
    from potato.errors import SshError
    from potato.runs.paths import open_store, run_paths
    from potato.runs.runlog import RunLog
    from tests.support.potato_project import make_project

    monkeypatch.setitem(openssh.SSH_OPTIONS, "ConnectTimeout", "2")
    config = load_config(make_project(tmp_path, n_items=4, model_training={"enabled": True, "backends": {
        "gpu-server": {"type": "ssh", "host": "127.0.0.1", "port": silent_port}}}))
    store = open_store(config)
    run = store.create_run("hf-text-classification", ["sentiment"], "gpu-server")
    store.transition(run.id, "running", from_states="queued")
    backend = config.model_training.backends["gpu-server"]
    ctx = RunContext(config, store, run, backend, RunLog(store, run.id, run_paths(config, run.id).run_log))

    @flow
    def connect_only():
        return connect_task.with_options(retry_delay_seconds=0)(ctx, steps_of(backend))

    with pytest.raises(SshError) as failed:
        connect_only()
    final = (f"ssh to 127.0.0.1 failed: Connection timed out on port {silent_port}. Fix: the host did not answer: "
             "check the network, a VPN, the port, and that its sshd answers (`ssh -v 127.0.0.1 true` shows where "
             "it stops)")
    assert str(failed.value) == final
    events = store.events(run.id)
    assert [e.data["text"] for e in events if e.kind == "step"] == [
        "connecting to 127.0.0.1",
        "waiting 5 s to connect again (attempt 2 of 3)",
        "connecting to 127.0.0.1 (attempt 2 of 3)",
        "waiting 15 s to connect again (attempt 3 of 3)",
        "connecting to 127.0.0.1 (attempt 3 of 3)",
    ]
    assert [e.data["message"] for e in events if e.kind == "log" and e.data["level"] == "warning"] == [
        f"{final}; connecting again in 5 s (attempt 2 of 3)",
        f"{final}; connecting again in 15 s (attempt 3 of 3)",
    ]
