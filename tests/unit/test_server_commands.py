"""``potato start`` and ``potato training register`` as functions (potato/server/commands.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request

import pytest
import yaml
from click.testing import CliRunner

from potato.annotations.labels import find_user_states
from potato.cli import main
from potato.runs.store import Store
from potato.server import commands
from tests.support.potato_project import make_project, write_user_state
from tests.unit.test_server_support import BACKENDS


class Echo:
    def __init__(self):
        self.out, self.err = [], []

    def __call__(self, text="", err=False):
        (self.err if err else self.out).append(str(text))


def _project(tmp_path, **mt):
    return make_project(tmp_path, n_items=10, model_training={"enabled": True, "backends": BACKENDS, **mt})


def test_start_refuses_an_invalid_config_with_validates_messages(tmp_path):
    from potato.validate import format_report, validate_config_file

    path = _project(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["model_training"]["backends"]["gpu-server"]["pyhton"] = "/usr/bin/python3"
    path.write_text(yaml.safe_dump(raw))
    echo = Echo()
    assert commands.start_command(path, echo=echo) == 1
    assert format_report(validate_config_file(path)) in echo.err
    assert "pyhton" in "\n".join(echo.err)
    assert not (tmp_path / "annotation_output" / "training" / "runs.db").exists()  # nothing started


def test_start_prints_warnings_and_the_debug_warning(tmp_path):
    path = _project(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["debug"] = True
    raw["model_training"]["backends"]["cluster"]["time"] = "12:00:00"
    path.write_text(yaml.safe_dump(raw))
    echo = Echo()
    config = commands.check_config(path, echo)
    assert config is not None
    text = "\n".join(echo.err)
    assert ("warning: model_training.backends.cluster.time is 12:00:00. A job that holds a GPU for more than "
            "6 hours is long on a shared cluster; check its policy") in text
    assert "debug is true and backend(s) cluster, gpu-server train over ssh" in text
    assert text.count("debug is true") == 1 and "Set debug: false" in text  # once, for both backends


def test_no_debug_warning_without_ssh_backends(tmp_path):
    path = make_project(tmp_path, n_items=10, model_training={"enabled": True})
    raw = yaml.safe_load(path.read_text())
    raw["debug"] = True
    path.write_text(yaml.safe_dump(raw))
    echo = Echo()
    assert commands.check_config(path, echo) is not None
    assert echo.err == []


def test_register_command(tmp_path):
    path = _project(tmp_path)
    text = commands.register_command("lab-workstation", path, server_url="http://annotate.example.org:8000")
    lines = text.splitlines()
    token = lines[2].strip()
    assert lines[0] == "Token for backend 'lab-workstation' (shown once; registering again replaces it):"
    assert lines[6] == f"  export POTATO_TRAINING_TOKEN={token}"
    assert lines[7] == "  potato training agent --server http://annotate.example.org:8000 --backend lab-workstation"
    with Store(tmp_path / "annotation_output" / "training" / "runs.db") as store:
        assert store.verify_token("lab-workstation", token)


def test_register_command_refuses_a_non_agent_backend(tmp_path):
    import click

    path = _project(tmp_path)
    with pytest.raises(click.ClickException, match="Backend 'cluster' is a slurm backend"):
        commands.register_command("cluster", path)


@pytest.mark.parametrize("server", ["waitress", "werkzeug"])
def test_start_serves_and_stops_cleanly_on_sigterm(tmp_path, monkeypatch, server):
    """The whole start path, with the Prefect API and the dispatcher replaced by recorders."""
    pytest.importorskip(server)
    from potato.server import background

    calls = []
    monkeypatch.setattr(background.Background, "start", lambda self: calls.append("start"))
    original_stop = background.Background.stop
    monkeypatch.setattr(background.Background, "stop", lambda self: (calls.append("stop"), original_stop(self)))
    path = _project(tmp_path)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    answers = []

    def client():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/admin/training/api/backends",
                                                 headers={"X-API-Key": "test-admin-key"})
                with urllib.request.urlopen(request, timeout=2) as response:
                    answers.append(response.status)
                break
            except OSError:
                time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    echo = Echo()
    assert commands.start_command(path, "127.0.0.1", port, server=server, echo=echo) == 0
    thread.join(5)
    assert answers == [200]
    assert calls == ["start", "stop"]
    assert echo.out[0] == f"Training page: http://127.0.0.1:{port}/admin/training"
    assert "Stopping (SIGTERM)…" in echo.err
    assert signal.getsignal(signal.SIGTERM) is not None


TRAINING_USER = ("annotation_output/training/user_state.json exists: an annotator signed in to Potato 2.12 as "
                 "'training', the directory where this project keeps its run store and runs. Their labels are never "
                 "read for training; give the annotator another user name (move that directory's user_state.json "
                 "and annotation_history.jsonl to a directory named after it)")


def test_an_annotator_named_training_is_never_read_and_validate_and_start_warn(tmp_path):
    path = make_project(tmp_path, n_items=4, annotators=("alice",), user_labels={"alice": {"r0": "positive"}})
    write_user_state(tmp_path / "annotation_output", "training", {"r1": {"sentiment": "negative"}})
    assert [user for user, _ in find_user_states(tmp_path / "annotation_output")] == ["alice"]
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.output == f"warning: {TRAINING_USER}\n{path}: valid (0 errors, 1 warning, 0 acknowledged)\n"
    echo = Echo()
    assert commands.check_config(path, echo=echo) is not None
    assert echo.err == [f"warning: {TRAINING_USER}"]


def test_the_training_page_s_address_is_recorded_for_the_links_a_run_leaves_in_prefect(tmp_path):
    import socket

    from potato.config import load_config
    from potato.runs.paths import run_page, training_page_file

    config = load_config(_project(tmp_path))
    assert run_page(config, 3) is None  # no server has started yet
    assert commands.training_page(config, "127.0.0.1", 8123) == "http://127.0.0.1:8123/admin/training"
    assert run_page(config, 3) == "http://127.0.0.1:8123/admin/training/runs/3"
    # On every interface, the address shown is the one given; the one recorded is this host's name.
    assert commands.training_page(config, "0.0.0.0", 8000) == "http://0.0.0.0:8000/admin/training"
    assert run_page(config, 3) == f"http://{socket.getfqdn()}:8000/admin/training/runs/3"
    assert commands.training_page(config, "::1", 8000) == "http://[::1]:8000/admin/training"
    training_page_file(config).write_text("javascript:alert(1)")
    assert run_page(config, 3) is None  # only a web address becomes a link
