"""The agent protocol, served by the flow for one ssh run on a private UNIX socket.

The socket sits in a fresh 0700 directory and is itself 0600; ssh's reverse
forward connects the remote ``/tmp`` socket (0600 too, owned by the login
user) to it. So the run does not depend on ``potato start`` listening on a
TCP port, and only the run's agent can reach it. Only the agent protocol is
served here: no Training page, no admin API — a request through the forward
arrives from the loopback, which must never count as an admin. The app is
``potato.protocol.app.make_app``: the same routes and checks as ``potato start``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

from werkzeug.serving import BaseWSGIServer, make_server

from potato.config import ProjectConfig
from potato.protocol.app import make_app
from potato.runs.store import Store


class ProtocolServer:
    """Serves the agent protocol on ``<private dir>/p.sock`` in a background thread."""

    def __init__(self, config: ProjectConfig, store: Store):
        self.directory = Path(tempfile.mkdtemp(prefix="potato-run-"))  # mkdtemp makes it 0700
        self.socket_path = str(self.directory / "p.sock")
        old_umask = os.umask(0o177)  # the socket is created 0600, never briefly wider
        try:
            self.server: BaseWSGIServer = make_server(
                "unix://" + self.socket_path, 0, make_app(config, store), threaded=True)
        finally:
            os.umask(old_umask)
        # A short poll interval: stop() waits for the loop to notice, at the end of every ssh run.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="potato-protocol", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
        shutil.rmtree(self.directory, ignore_errors=True)
