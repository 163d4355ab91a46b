"""The real annotation tool, potato-annotation 2.12.1, as a test service: its server and its HTTP API.

``scripts/install-potato212.sh`` (run by ``scripts/test.sh``) puts it in
``.venv-potato212`` (or ``$POTATO212_VENV``): its own virtualenv, because it
has this project's import name and console script. The ``potato212`` fixture
finds it, skipping the test when it is missing (failing under ``CI=true``).

``OurServer`` is this project's ``potato start`` beside it, with its admin API;
``project_config`` the keys of a config both read (items in a data_directory,
sign-in without passwords, one radio schema ``tone``).

``Potato212Server`` starts ``potato start CONFIG -p PORT`` there, on
loopback, in the project's directory, and stops it with SIGTERM (then
SIGKILL). ``Annotator`` talks to it the way its annotate page does
(as measured against it): ``POST /auth`` for a session cookie,
``POST /updateinstance`` to save a label, ``POST /annotate`` with
``next_instance`` to move on, and the page's hidden ``instance_id`` and
``checked`` radio inputs to read what it shows.
"""

from __future__ import annotations

import html
import http.cookiejar
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

import pytest

from tests.support.runs import POTATO, free_port, stop_group, wait_for

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("POTATO212_VENV") or REPO / ".venv-potato212")
START_TIMEOUT_S = 90


@pytest.fixture(scope="session")
def potato212() -> Path:
    """The ``potato`` command of the real potato-annotation 2.12.1."""
    command = VENV / "bin" / "potato"
    if not command.exists():
        reason = f"potato-annotation 2.12.1 is not installed in {VENV}; run: bash scripts/install-potato212.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the Potato 2.12 tests must run)")
        pytest.skip(reason)
    return command


class Potato212Server:
    """One ``potato start`` of Potato 2.12.1 serving a project's annotators."""

    def __init__(self, command: Path, config: Path, log: Path):
        self.command = command
        self.config = config
        self.log = log
        self.url = ""
        self.process: subprocess.Popen | None = None

    def start(self) -> "Potato212Server":
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        out = open(self.log, "ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("PYTHONPATH", None)  # this project's `potato` must not shadow 2.12's
        self.process = subprocess.Popen(
            [str(self.command), "start", str(self.config), "-p", str(port), "--host", "127.0.0.1"],
            cwd=self.config.parent, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )
        out.close()
        wait_for(self._answers, START_TIMEOUT_S, f"Potato 2.12.1 to serve {self.url} (log: {self.log})")
        return self

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"Potato 2.12.1 exited with {self.process.returncode}: {self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(self.url + "/", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process, 20)

    def status_of(self, path: str) -> int:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code


TONE = {"annotation_type": "radio", "name": "tone", "description": "How does it sound?", "labels": ["calm", "angry"]}


def project_config(name: str, data_directory: str, id_key: str, text_key: str, api_key: str) -> dict:
    """The config keys of a project served by 2.12.1 (annotators sign in without a password) and by this
    project's ``potato start`` (*api_key*: its admin API's key), its items in *data_directory*, schema ``tone``."""
    return {
        "annotation_task_name": name,
        "task_dir": ".",
        "data_directory": data_directory,
        "item_properties": {"id_key": id_key, "text_key": text_key},
        "output_annotation_dir": "annotations",
        "admin_api_key": api_key,
        "user_config": {"allow_all_users": True},
        "require_password": False,
        "annotation_schemes": [TONE],
    }


_INSTANCE_ID = re.compile(r'id="instance_id"[^>]*\bvalue="([^"]*)"')
_RADIO = re.compile(r"<input\b[^>]*>")


class Annotator:
    """One annotator's browser session on a Potato 2.12.1 server, over its own HTTP endpoints."""

    def __init__(self, server: Potato212Server, name: str):
        self.server = server
        self.name = name
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        self._post_form("/auth", {"email": name, "pass": ""})

    def _request(self, method: str, path: str, data: bytes | None = None, content_type: str | None = None) -> str:
        request = urllib.request.Request(self.server.url + path, data=data, method=method)
        if content_type:
            request.add_header("Content-Type", content_type)
        with self.opener.open(request, timeout=30) as response:
            return response.read().decode("utf-8", errors="replace")

    def _post_form(self, path: str, fields: dict) -> str:
        return self._request("POST", path, urllib.parse.urlencode(fields).encode(),
                             "application/x-www-form-urlencoded")

    def _post_json(self, path: str, body: dict) -> str:
        return self._request("POST", path, json.dumps(body).encode(), "application/json")

    def page(self) -> str:
        return self._request("GET", "/annotate")

    def current(self) -> str:
        found = _INSTANCE_ID.search(self.page())
        assert found, f"{self.name}'s annotate page shows no item"
        return html.unescape(found.group(1))

    def label(self, schema: str, label: str) -> str:
        """Choose *label* for the item on screen, as clicking its radio does; return the item's id."""
        item = self.current()
        answer = json.loads(self._post_json("/updateinstance", {
            "instance_id": item, "annotations": {f"{schema}:{label}": label},
            "client_timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }))
        assert answer.get("status") == "success", answer
        return item

    def label_in_turn(self, schema: str, count: int, choose: Callable[[str], str]) -> list[str]:
        """Label the next *count* items as 2.12 serves them, each with ``choose(item id)``; return their ids."""
        labelled = []
        for _ in range(count):
            labelled.append(self.label(schema, choose(self.current())))
            self.next()
        return labelled

    def next(self) -> str:
        """Go to the next item (the Next button); return its id."""
        self.press_next(self.current())
        return self.current()

    def press_next(self, item: str) -> None:
        """Press Next on *item* (the item on screen), whether or not another item follows."""
        self._post_json("/annotate", {"action": "next_instance", "instance_id": item})

    def go_to(self, index: int) -> str:
        """Go back to the *index*-th item this annotator was served (2.12 goes no further ahead); return its id."""
        self._post_json("/annotate", {"action": "go_to", "go_to": index})
        return self.current()

    def served(self) -> str | None:
        """The id of the item on screen, or None when the page serves none (nothing to annotate)."""
        found = _INSTANCE_ID.search(self.page())
        return html.unescape(found.group(1)) if found else None

    def go_to_item(self, item: str, limit: int = 200) -> str:
        """Press Next until *item* is on screen; return the page."""
        for _ in range(limit):
            if self.current() == item:
                return self.page()
            self.next()
        raise AssertionError(f"{self.name} never reached item {item!r}")

    def checked(self, page: str, schema: str) -> list[str]:
        """The labels of *schema* whose radio the page shows pre-checked."""
        found = []
        for tag in _RADIO.findall(page):
            if 'type="radio"' in tag and f'name="{schema}"' in tag and re.search(r"\bchecked\b", tag):
                found.append(html.unescape(re.search(r'\bvalue="([^"]*)"', tag).group(1)))
        return found


class OurServer:
    """This project's ``potato start`` beside 2.12.1, and its admin API (*api_key*: the config's admin_api_key)."""

    def __init__(self, config: Path, log: Path, api_key: str):
        self.api_key = api_key
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/admin/training/api"
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [POTATO, "start", str(config), "--port", str(self.port)], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.log = log
        wait_for(lambda: self._try("/auto-retrain"), 120, f"potato start to answer (log: {log})")

    def _try(self, path: str):
        if self.process.poll() is not None:
            raise AssertionError(f"potato start exited: {self.log.read_text()[-3000:]}")
        try:
            return self.get(path)
        except OSError:
            return None

    def get(self, path: str) -> dict:
        request = urllib.request.Request(self.url + path, headers={"X-API-Key": self.api_key})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def post(self, path: str, method: str = "POST") -> dict:
        request = urllib.request.Request(self.url + path, data=b"{}" if method == "POST" else None, method=method,
                                         headers={"X-API-Key": self.api_key, "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def runs(self) -> list[dict]:
        return self.get("/runs")["runs"]

    def watcher_saw(self, annotations: int) -> dict:
        """Wait for the watcher's check after the files hold *annotations*; return its status."""
        return wait_for(lambda: (s := self.get("/auto-retrain"))["annotations"] == annotations and s, 30,
                          f"the auto-retrain watcher to count {annotations} annotations")

    def stop(self) -> None:
        stop_group(self.process, 60)
